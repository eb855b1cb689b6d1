"""Hand-written GPU kernels (Triton). triton is an optional import inside each kernel module: where it
is not installed (the CPU wheel of torch does not bring it) the modules still import, and a kernel
raises, naming the cause, when it is called."""
