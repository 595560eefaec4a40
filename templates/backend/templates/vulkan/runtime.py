"""Runtime: Vulkan buffers (Allocator), GLSL to SPIR-V by glslangValidator (Compiler), compute
pipelines (Program), through the `vulkan` Python binding (cffi over the system's libvulkan).

Starter: vulkan. Plain on purpose: buffers live in host-visible, coherent memory, mapped once,
so a copy is a memcpy; each launch records one command buffer, submits it and waits for its
fence, so a buffer is never in use when it is copied or rebound. A faster backend keeps
buffers in device-local memory (copies through a staging buffer) and records many dispatches
per submission (`Device.batch`: docs/porting.md, "Optional entries"). A kernel's buffers are
storage-buffer bindings 0..n-1 of set 0 and its scalars one push-constant block, in argument
order: the pipeline layout is built from the kernel's Signature, which Vulkan needs before the
pipeline.
"""
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from portkit.abi import BackendUnavailable, CompileError, Compiler, Program
from portkit.abi.backend import Allocator
from portkit.abi.kernel import Signature

try:
    import vulkan as vk
except (ImportError, OSError) as error:   # OSError: the binding found no libvulkan
    vk, MISSING = None, str(error)

ALL_BYTES = 0xFFFFFFFFFFFFFFFF               # VK_WHOLE_SIZE as the binding's unsigned field
HOST_MEMORY = 0x2 | 0x4                      # HOST_VISIBLE | HOST_COHERENT


def _info(name: str, **fields):
    """A Vulkan create-info struct with its sType filled in from its name."""
    words = "".join("_" + c if c.isupper() else c for c in name[2:]).upper()
    return getattr(vk, name)(sType=getattr(vk, f"VK_STRUCTURE_TYPE{words}"), **fields)


def open_gpu(index: int = 0) -> SimpleNamespace:
    """Vulkan 1.2 on physical device `index`, with the features the declared dtypes need, one
    compute queue, a command pool and a fence; BackendUnavailable naming the fix without one."""
    if vk is None:
        raise BackendUnavailable(f"the vulkan binding cannot load ({MISSING})",
                                 "pip install vulkan; apt-get install libvulkan1")
    if shutil.which("glslangValidator") is None:
        raise BackendUnavailable("glslangValidator (GLSL to SPIR-V) is not on PATH",
                                 "apt-get install glslang-tools")
    app = vk.VkApplicationInfo(sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
                               pApplicationName="portkit", apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
    try:
        instance = vk.vkCreateInstance(_info("VkInstanceCreateInfo", pApplicationInfo=app), None)
        physical = vk.vkEnumeratePhysicalDevices(instance)[index]
    except (vk.VkError, IndexError) as error:
        raise BackendUnavailable(f"no Vulkan device {index} ({type(error).__name__})",
                                 "apt-get install mesa-vulkan-drivers (lavapipe)") from None
    family = next(i for i, q in enumerate(vk.vkGetPhysicalDeviceQueueFamilyProperties(physical))
                  if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT)
    queue = _info("VkDeviceQueueCreateInfo", queueFamilyIndex=family, queueCount=1,
                  pQueuePriorities=[1.0])
    v12 = vk.VkPhysicalDeviceVulkan12Features(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, shaderInt8=True,
        shaderFloat16=True, storageBuffer8BitAccess=True, uniformAndStorageBuffer8BitAccess=True)
    v11 = vk.VkPhysicalDeviceVulkan11Features(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, pNext=v12,
        storageBuffer16BitAccess=True, uniformAndStorageBuffer16BitAccess=True)
    features = vk.VkPhysicalDeviceFeatures(shaderInt16=True, shaderInt64=True,
                                           shaderFloat64=True)
    device = vk.vkCreateDevice(physical, _info(
        "VkDeviceCreateInfo", pNext=v11, queueCreateInfoCount=1, pQueueCreateInfos=[queue],
        pEnabledFeatures=features), None)
    pool = vk.vkCreateCommandPool(device, _info(
        "VkCommandPoolCreateInfo", queueFamilyIndex=family,
        flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
    return SimpleNamespace(
        physical=physical, device=device, queue=vk.vkGetDeviceQueue(device, family, 0),
        properties=vk.vkGetPhysicalDeviceProperties(physical),
        memory=vk.vkGetPhysicalDeviceMemoryProperties(physical),
        commands=vk.vkAllocateCommandBuffers(device, _info(
            "VkCommandBufferAllocateInfo", commandPool=pool, commandBufferCount=1,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY))[0],
        fence=vk.vkCreateFence(device, _info("VkFenceCreateInfo"), None),
        instance=instance, pool=pool)


class {{ cookiecutter.__title }}Buffer(SimpleNamespace):
    """A VkBuffer, its memory, and that memory mapped as a numpy byte array (`host`)."""


class {{ cookiecutter.__title }}Allocator(Allocator):
    """Storage buffers in host-visible memory: copies in and out are memcpys of the mapping."""

    def __init__(self, gpu: SimpleNamespace):
        self.gpu = gpu

    def alloc(self, nbytes: int) -> {{ cookiecutter.__title }}Buffer:
        device, size = self.gpu.device, max(nbytes, 4)
        buffer = vk.vkCreateBuffer(device, _info(
            "VkBufferCreateInfo", size=size, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        need = vk.vkGetBufferMemoryRequirements(device, buffer)
        types = self.gpu.memory.memoryTypes
        kind = next(i for i in range(self.gpu.memory.memoryTypeCount)
                    if need.memoryTypeBits >> i & 1
                    and types[i].propertyFlags & HOST_MEMORY == HOST_MEMORY)
        memory = vk.vkAllocateMemory(device, _info(
            "VkMemoryAllocateInfo", allocationSize=need.size, memoryTypeIndex=kind), None)
        vk.vkBindBufferMemory(device, buffer, memory, 0)
        host = np.frombuffer(vk.vkMapMemory(device, memory, 0, size, 0), np.uint8)
        return {{ cookiecutter.__title }}Buffer(buffer=buffer, memory=memory, host=host)

    def free(self, buffer: {{ cookiecutter.__title }}Buffer, nbytes: int) -> None:
        vk.vkUnmapMemory(self.gpu.device, buffer.memory)
        vk.vkDestroyBuffer(self.gpu.device, buffer.buffer, None)
        vk.vkFreeMemory(self.gpu.device, buffer.memory, None)

    def copyin(self, buffer: {{ cookiecutter.__title }}Buffer, source: memoryview) -> None:
        data = np.frombuffer(source, np.uint8)
        buffer.host[:data.size] = data

    def copyout(self, destination: memoryview, buffer: {{ cookiecutter.__title }}Buffer) -> None:
        out = np.frombuffer(destination, np.uint8)
        out[:] = buffer.host[:out.size]


class {{ cookiecutter.__title }}Compiler(Compiler):
    """GLSL 450 compute shader text in, SPIR-V out, by one glslangValidator process."""

    def compile(self, source: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="portkit-spirv-") as folder:
            out = Path(folder) / "kernel.spv"
            done = subprocess.run(["glslangValidator", "-V", "--target-env", "vulkan1.2",
                                   "--stdin", "-S", "comp", "-o", str(out)],
                                  input=source, capture_output=True, text=True)
            if done.returncode != 0:
                raise CompileError("glslangValidator rejected the shader (the GLSL is in "
                                   ".source)", source, done.stdout + done.stderr)
            return out.read_bytes()


class {{ cookiecutter.__title }}Program(Program):
    """One compute pipeline, laid out from the kernel's Signature; a launch binds the buffers
    to its descriptor set, pushes the scalars, dispatches the grid and waits."""

    def __init__(self, gpu: SimpleNamespace, name: str, binary: bytes, signature: Signature):
        self.gpu, device = gpu, gpu.device
        count = len(signature.buffers)
        storage = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
        bindings = [vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=storage, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(count)]
        self.set_layout = vk.vkCreateDescriptorSetLayout(device, _info(
            "VkDescriptorSetLayoutCreateInfo", bindingCount=count, pBindings=bindings), None)
        self.words = len(signature.scalars)
        pushed = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                         size=4 * self.words)] if self.words else []
        self.layout = vk.vkCreatePipelineLayout(device, _info(
            "VkPipelineLayoutCreateInfo", setLayoutCount=1, pSetLayouts=[self.set_layout],
            pushConstantRangeCount=len(pushed), pPushConstantRanges=pushed), None)
        module = vk.vkCreateShaderModule(device, _info(
            "VkShaderModuleCreateInfo", codeSize=len(binary), pCode=binary), None)
        stage = _info("VkPipelineShaderStageCreateInfo", stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
                      module=module, pName="main")
        self.pipeline = vk.vkCreateComputePipelines(device, None, 1, [_info(
            "VkComputePipelineCreateInfo", stage=stage, layout=self.layout)], None)[0]
        vk.vkDestroyShaderModule(device, module, None)
        sizes = [vk.VkDescriptorPoolSize(type=storage, descriptorCount=max(count, 1))]
        self.pool = vk.vkCreateDescriptorPool(device, _info(
            "VkDescriptorPoolCreateInfo", maxSets=1, poolSizeCount=1, pPoolSizes=sizes), None)
        self.set = vk.vkAllocateDescriptorSets(device, _info(
            "VkDescriptorSetAllocateInfo", descriptorPool=self.pool, descriptorSetCount=1,
            pSetLayouts=[self.set_layout]))[0]

    def __call__(self, buffers: list, scalars: list[int], grid, block,
                 wait: bool = False) -> float | None:
        gpu, commands = self.gpu, self.gpu.commands
        if buffers:
            vk.vkUpdateDescriptorSets(gpu.device, len(buffers), [_info(
                "VkWriteDescriptorSet", dstSet=self.set, dstBinding=i, descriptorCount=1,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.buffer, offset=0,
                                                       range=ALL_BYTES)])
                for i, b in enumerate(buffers)], 0, None)
        start = time.perf_counter()
        vk.vkBeginCommandBuffer(commands, _info("VkCommandBufferBeginInfo"))
        vk.vkCmdBindPipeline(commands, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.pipeline)
        vk.vkCmdBindDescriptorSets(commands, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.layout,
                                   0, 1, [self.set], 0, None)
        if self.words:
            words = np.array(scalars, np.int64).astype(np.uint32)   # each one's 32 bits
            vk.vkCmdPushConstants(commands, self.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                  4 * self.words, vk.ffi.from_buffer(words))
        vk.vkCmdDispatch(commands, *grid)
        vk.vkEndCommandBuffer(commands)
        vk.vkQueueSubmit(gpu.queue, 1, [_info("VkSubmitInfo", commandBufferCount=1,
                                              pCommandBuffers=[commands])], gpu.fence)
        vk.vkWaitForFences(gpu.device, 1, [gpu.fence], True, 2**63 - 1)
        vk.vkResetFences(gpu.device, 1, [gpu.fence])
        return time.perf_counter() - start if wait else None
