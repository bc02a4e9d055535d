/* A stand-in for NVIDIA's libcuda.so.1 on machines without a GPU: the CUDA
 * driver calls the tests make, answering from the device nodes the process
 * can see (/dev/nvidia<N>), as the real driver answers from the GPUs its
 * container was given. No GPU, no kernel driver: named in every test that
 * mounts it. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101

static int initialized;
static int minors[64];
static int count;

static int by_minor(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    DIR *dev = opendir("/dev");
    count = 0;
    if (dev) {
        struct dirent *entry;
        while ((entry = readdir(dev)) && count < 64) {
            char *end;
            if (strncmp(entry->d_name, "nvidia", 6) != 0) continue;
            long minor = strtol(entry->d_name + 6, &end, 10);
            if (end == entry->d_name + 6 || *end) continue;
            minors[count++] = (int)minor;
        }
        closedir(dev);
    }
    qsort(minors, count, sizeof minors[0], by_minor);
    initialized = 1;
    return count ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult cuDeviceGetCount(int *out) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    *out = count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device || ordinal < 0 || ordinal >= count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!name || len <= 0 || device < 0 || device >= count) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "sunk stand-in GPU (/dev/nvidia%d)", minors[device]);
    return CUDA_SUCCESS;
}
