/* A stand-in for libcuda.so.1 with two devices, for the GPU discovery test on machines without a
 * GPU: the driver API entry points the worker daemon looks up, with fixed answers. */
#include <string.h>

int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }

int cuDeviceGetCount(int* count) {
  *count = 2;
  return 0;
}

int cuDeviceGet(int* device, int ordinal) {
  if (ordinal < 0 || ordinal > 1) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *device = ordinal;
  return 0;
}

int cuDeviceGetName(char* name, int len, int device) {
  const char* names[] = {"Fake H200", "Fake H100"};
  strncpy(name, names[device], (size_t)len);
  return 0;
}

int cuDeviceGetUuid_v2(unsigned char* uuid, int device) {
  for (int i = 0; i < 16; ++i) uuid[i] = (unsigned char)(device * 16 + i);
  uuid[15] = 0xab;
  return 0;
}

int cuDeviceTotalMem_v2(size_t* bytes, int device) {
  /* 141 GiB and 80 GiB, as an H200 and an H100 report about that much. */
  *bytes = (size_t)(device == 0 ? 141 : 80) << 30;
  return 0;
}
