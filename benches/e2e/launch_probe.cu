// What slows a training thread's kernel launches beside hybrid decode (launch_probe.py).
//
// Built by launch_probe.py with nvcc into a shared library and called through ctypes, which
// releases the GIL for each call: the loops below run on the host without Python in between,
// as the CUDA calls of PyTorch's launch path and of nvJPEG's decode threads do.
//
//   launch_loop  the "training thread": `iters` launches of a one-block kernel; host ns per launch
//   hammer       the "decode thread": one kind of CUDA call in a loop until *stop; the call count
#include <cuda_runtime.h>
#include <stdint.h>
#include <time.h>

__global__ void tiny(float *p) {
  if (threadIdx.x == 0) p[0] += 1.0f;
}

static double now_ns() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

// Launches `iters` tiny kernels on `stream` (waiting for the stream every 256 launches, so that
// the queue never fills: a full queue would time the GPU, not the launch); *ns gets the host
// time per launch, the waits left out. Returns cudaGetLastError().
extern "C" int launch_loop(int iters, void *stream, float *dev, double *ns) {
  cudaStream_t s = (cudaStream_t)stream;
  double spent = 0.0;
  for (int done = 0; done < iters;) {
    int n = iters - done < 256 ? iters - done : 256;
    double t0 = now_ns();
    for (int i = 0; i < n; i++) tiny<<<1, 32, 0, s>>>(dev);
    spent += now_ns() - t0;
    done += n;
    cudaStreamSynchronize(s);
  }
  *ns = spent / iters;
  return (int)cudaGetLastError();
}

// One kind of call in a loop on `stream` until *stop is non-zero; returns how many loops ran,
// or -1 on an error. kind 1: a 4 KiB host-to-device copy from pinned memory; 2: an event
// record; 3: a tiny kernel; 4: an event record and a wait for it; 5: what nvJPEG's batched
// hardware decode does per image (a copy, an event record, a kernel, a wait).
extern "C" long long hammer(int kind, volatile int *stop, void *stream, float *dev, void *pinned, void *devbuf) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaEvent_t ev;
  if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) return -1;
  long long n = 0;
  while (!*stop) {
    switch (kind) {
      case 1:
        cudaMemcpyAsync(devbuf, pinned, 4096, cudaMemcpyHostToDevice, s);
        break;
      case 2:
        cudaEventRecord(ev, s);
        break;
      case 3:
        tiny<<<1, 32, 0, s>>>(dev);
        break;
      case 4:
        cudaEventRecord(ev, s);
        cudaEventSynchronize(ev);
        break;
      default:
        cudaMemcpyAsync(devbuf, pinned, 4096, cudaMemcpyHostToDevice, s);
        cudaEventRecord(ev, s);
        tiny<<<1, 32, 0, s>>>(dev);
        cudaEventSynchronize(ev);
        break;
    }
    n++;
    if ((n & 255) == 0) cudaStreamSynchronize(s);  // the queue stays short
  }
  cudaStreamSynchronize(s);
  cudaEventDestroy(ev);
  return cudaGetLastError() == cudaSuccess ? n : -1;
}
