"""What the machine has: GPUs through NVML, CPU cores, RAM and disk. Never initialises CUDA.

The kernel, the planner and the workers all ask here; nothing in this package imports torch.
"""

from nbtrain.hardware.facts import GPU, Hardware, probe

__all__ = ["GPU", "Hardware", "probe"]
