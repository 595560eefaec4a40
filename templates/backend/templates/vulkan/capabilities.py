"""The datasheet: what the {{ cookiecutter.name }} device can do. portkit assumes nothing else.

Starter: vulkan, read from the Vulkan physical device's limits. Every dtype but bfloat16 (GLSL
has no bfloat16 type; a renderer would emulate it in float, as portkit's cpu backend does).
EXP2, LOG2 and SIN are left out: GLSL has them for float only, and lavapipe's lose the
ABI's accuracy, so codegen decomposes them into exact ops. Change each line to your chip's
facts as its parts pass conformance (docs/porting.md, "Capabilities").
"""
from portkit.abi import Capabilities, dtypes
from portkit.abi.ops import COMPUTE, Op

DTYPES = frozenset(dtypes.ALL) - {dtypes.bfloat16}


def capabilities(properties) -> Capabilities:
    """This device's capabilities; `properties` are its VkPhysicalDeviceProperties."""
    limits = properties.limits
    return Capabilities(
        dtypes=DTYPES,
        ops=frozenset(COMPUTE) - {Op.EXP2, Op.LOG2, Op.SIN},
        max_block_threads=limits.maxComputeWorkGroupInvocations,
        max_block=tuple(limits.maxComputeWorkGroupSize),
        max_grid=tuple(limits.maxComputeWorkGroupCount),
        local_memory_bytes=limits.maxComputeSharedMemorySize,
        max_buffers=limits.maxPerStageDescriptorStorageBuffers,
        max_buffer_bytes=limits.maxStorageBufferRange,
        max_scalars=limits.maxPushConstantsSize // 4,    # one 32-bit word each
        threads_are_loops=False,   # invocations are lanes (lavapipe vectorizes them itself)
        # llvmpipe (lavapipe) stops a shader after 65,535 loop iterations in all, silently
        max_loop_trips=65535 if "llvmpipe" in properties.deviceName else None,
        device_name=f"{{ cookiecutter.name }} (vulkan starter: {properties.deviceName})")
