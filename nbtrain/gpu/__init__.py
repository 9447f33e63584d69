"""GPU facts read through NVML, without initialising CUDA in the calling process."""
