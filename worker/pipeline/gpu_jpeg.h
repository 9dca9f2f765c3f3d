// JPEG decoding on the GPU with nvJPEG (--decode gpu): the hardware JPEG engines where the GPU has
// them (A100, H100, H200...) for the baseline streams they take, nvJPEG's CUDA decoder for the
// others (progressive, 4:1:0...). Pixels come back to host memory as interleaved RGB, exactly where
// the CPU decoder would have put them, so the rest of the pipeline does not change.
//
// nvJPEG's pixels are not libjpeg-turbo's: its inverse DCT and chroma upsampling round differently,
// so decoded values differ by a few levels on some pixels (BENCHMARKS.md measures how many), and
// may differ between GPU generations and nvJPEG versions. That is why --decode cpu is the default;
// a job that decodes on the GPU decodes all its rows there, so results stay identical for any
// number of workers of one kind of GPU.
//
// Built only with a CUDA LibTorch and nvJPEG (nvjpeg.h and libnvjpeg from the CUDA toolkit); other
// builds keep the interface and Create says why it cannot.
#ifndef TALLY_WORKER_PIPELINE_GPU_JPEG_H_
#define TALLY_WORKER_PIPELINE_GPU_JPEG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/jpeg.h"

namespace tally {

// Whether this build can decode JPEG on the GPU at all.
bool GpuJpegBuilt();

struct GpuJpegImage {
  const std::string* bytes = nullptr;  // A JPEG that passed InspectJpeg (common/formats/jpeg.h).
  std::string name;                    // For errors.
  int height = 0;
  int width = 0;
  uint8_t* out = nullptr;              // height * width * 3 bytes of host memory: RGB, row-major.
  absl::Status status;                 // Set by Decode.
};

// One per thread (nvJPEG's decode states are not thread-safe); the library handles are shared by
// every decoder of a device.
class GpuJpegDecoder {
 public:
  // UNAVAILABLE without nvJPEG in this build or when nvJPEG cannot start on `device`.
  static absl::StatusOr<std::unique_ptr<GpuJpegDecoder>> Create(int device);
  virtual ~GpuJpegDecoder() = default;
  // Decodes every image into its `out`, setting its status (a corrupt stream fails that image
  // only). Blocks until the pixels are in host memory.
  void Decode(std::vector<GpuJpegImage>* images) {
    Start(images);
    Finish();
  }
  // The same in two halves, so the caller can work while the GPU decodes: Start queues the work
  // (`images` and their bytes must stay put until Finish), Finish waits for it and fills the
  // outputs and statuses. One Start at a time.
  virtual void Start(std::vector<GpuJpegImage>* images) = 0;
  virtual void Finish() = 0;
  // "hardware" (the GPU's JPEG engines) or "cuda" (nvJPEG's CUDA decoder only).
  virtual std::string backend() const = 0;
};

}  // namespace tally

#endif  // TALLY_WORKER_PIPELINE_GPU_JPEG_H_
