// The CUDA session's definitions for test_cuda_model (session.cuh is included by exactly one .cu of a program).
#include "ling/cuda/session.cuh"
