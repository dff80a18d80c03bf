"""Where a model comes from, seen from the kernel: the Hub, GGUF files, the packaged pretrained model."""
