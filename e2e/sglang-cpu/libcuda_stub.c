/* A stand-in for the NVIDIA driver's libcuda.so.1 on a machine without a GPU (the e2e world's
 * real-engine mode, e2e/sglang-cpu/install.sh). SGLang imports sgl_kernel at module load even on
 * its CPU path; the CUDA build of that extension links libcuda.so.1 and imports exactly one driver
 * symbol, cuPointerGetAttribute. Every function here reports CUDA_ERROR_NO_DEVICE (100), so
 * torch.cuda.is_available() stays False and nothing ever runs on a "GPU".
 *
 *   gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 libcuda_stub.c
 */
#define CUDA_ERROR_NO_DEVICE 100

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned int flags) {
  (void)flags;
  return CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *version) {
  if (version) *version = 0;
  return CUDA_ERROR_NO_DEVICE;
}

CUresult cuDeviceGetCount(int *count) {
  if (count) *count = 0;
  return CUDA_ERROR_NO_DEVICE;
}

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
  (void)data;
  (void)attribute;
  (void)ptr;
  return CUDA_ERROR_NO_DEVICE;
}
