"""Display code for the kernel and the terminal. Imports no torch and nothing from nbtrain.worker."""
