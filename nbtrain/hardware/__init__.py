"""What the machine has: NVIDIA GPUs through NVML, an Apple MPS GPU or Ascend NPUs from platform facts,
CPU cores, RAM and disk. Never initialises CUDA.

The kernel, the planner and the workers all ask here; nothing in this package imports torch.
"""

from nbtrain.hardware.facts import GPU, Accelerator, Hardware, probe

__all__ = ["GPU", "Accelerator", "Hardware", "probe"]
