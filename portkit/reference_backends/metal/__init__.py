"""The Metal reference backend (macOS): MSL from the C-style renderer, run through pyobjc.

    device.py        find_device() -> the system's MTLDevice; load() -> Device
    capabilities.py  capabilities(...): every Apple GPU since the A11, or a device's own limits
    renderer.py      MetalRenderer: Metal Shading Language
    runtime.py       MetalAllocator (shared MTLBuffers), MetalCompiler (newLibraryWithSource),
                     MetalProgram (one command buffer per launch), MetalBatch (one
                     command buffer per batch)

On any other system `load()` says "Metal needs macOS". Nothing here has run on a Mac yet: see
docs/backends/metal.md for what is and is not verified.
"""
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.metal.device import load

backend = Backend("metal", load, "Metal Shading Language through pyobjc (macOS only)",
                  abi_version=ABI_VERSION)
