// Internal to the metrics library: TALLY_HD marks plain C++ functions that nvcc also compiles for
// the device (metrics/gpu/*.cu), so the CPU and GPU paths run one copy of the arithmetic whose
// results they must share to the bit.
#ifndef TALLY_METRICS_HOST_DEVICE_H_
#define TALLY_METRICS_HOST_DEVICE_H_

#ifdef __CUDACC__
#define TALLY_HD __host__ __device__ __forceinline__
#define TALLY_UNROLL _Pragma("unroll")
#else
#define TALLY_HD inline
#define TALLY_UNROLL
#endif

#endif  // TALLY_METRICS_HOST_DEVICE_H_
