#include "worker/pipeline/gpu_jpeg.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

#if TALLY_NVJPEG
#include <cuda_runtime.h>
#include <nvjpeg.h>

#include <map>
#include <mutex>
#endif

namespace tally {

#if !TALLY_NVJPEG

bool GpuJpegBuilt() { return false; }

absl::StatusOr<std::unique_ptr<GpuJpegDecoder>> GpuJpegDecoder::Create(int device) {
  return absl::UnavailableError(
      "this tally-worker was built without nvJPEG (it needs a CUDA LibTorch and the CUDA toolkit's nvjpeg); "
      "use --decode cpu");
}

#else

bool GpuJpegBuilt() { return true; }

namespace {

std::string NvjpegError(const char* what, nvjpegStatus_t s) {
  static const char* const kNames[] = {"success", "not initialized", "invalid parameter", "bad JPEG",
                                       "JPEG not supported", "allocator failure", "execution failed",
                                       "architecture mismatch", "internal error", "implementation not supported",
                                       "incomplete bitstream"};
  const int i = static_cast<int>(s);
  return absl::StrCat(what, ": nvJPEG ",
                      i >= 0 && i < static_cast<int>(sizeof(kNames) / sizeof(kNames[0])) ? kNames[i] : "error",
                      " (", i, ")");
}

// The library handles of one device, created once and kept for the life of the process (nvJPEG
// handles are thread-safe; creating the hardware one costs tens of milliseconds).
struct DeviceHandles {
  nvjpegHandle_t hardware = nullptr;  // Null where the GPU has no JPEG engine.
  nvjpegHandle_t cuda = nullptr;      // nvJPEG's GPU-assisted decoder: every stream it supports.
};

absl::StatusOr<DeviceHandles> HandlesFor(int device) {
  static std::mutex mu;
  static std::map<int, DeviceHandles>* handles = new std::map<int, DeviceHandles>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  if (cudaSetDevice(device) != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cannot use CUDA device ", device, " for JPEG decoding"));
  }
  // Chroma is upsampled by interpolation, as libjpeg-turbo's default ("fancy") upsampling does,
  // not by replication: the pixels come out closer to the CPU decoder's.
  const unsigned flags = NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION;
  DeviceHandles h;
  // TALLY_NVJPEG_BACKEND=cuda: leave the JPEG engines out (benchmarks compare the two).
  const char* only = std::getenv("TALLY_NVJPEG_BACKEND");
  if ((only != nullptr && std::string(only) == "cuda") ||
      nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, flags, &h.hardware) != NVJPEG_STATUS_SUCCESS) {
    h.hardware = nullptr;
  }
  nvjpegStatus_t s = nvjpegCreateEx(NVJPEG_BACKEND_GPU_HYBRID, nullptr, nullptr, flags, &h.cuda);
  if (s != NVJPEG_STATUS_SUCCESS) s = nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, flags, &h.cuda);
  if (s != NVJPEG_STATUS_SUCCESS) return absl::UnavailableError(NvjpegError("cannot start nvJPEG", s));
  (*handles)[device] = h;
  return h;
}

class NvjpegDecoder : public GpuJpegDecoder {
 public:
  NvjpegDecoder(int device, DeviceHandles handles) : device_(device), handles_(handles) {}
  ~NvjpegDecoder() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (hw_state_) nvjpegJpegStateDestroy(hw_state_);
    if (cuda_state_) nvjpegJpegStateDestroy(cuda_state_);
    if (parsed_) nvjpegJpegStreamDestroy(parsed_);
    if (device_buffer_) cudaFree(device_buffer_);
    if (host_buffer_) cudaFreeHost(host_buffer_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    if (cudaSetDevice(device_) != cudaSuccess) return absl::UnavailableError("cudaSetDevice failed");
    // The highest priority: the decode's few kernels go ahead of the model's, which keep the GPU
    // busy (a batch waiting for its pixels is a batch the model does not run).
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest) != cudaSuccess) {
      return absl::UnavailableError("cannot create a CUDA stream for JPEG decoding");
    }
    nvjpegStatus_t s = nvjpegJpegStateCreate(handles_.cuda, &cuda_state_);
    if (s != NVJPEG_STATUS_SUCCESS) return absl::UnavailableError(NvjpegError("decode state", s));
    if (handles_.hardware) {
      if (nvjpegJpegStateCreate(handles_.hardware, &hw_state_) != NVJPEG_STATUS_SUCCESS ||
          nvjpegJpegStreamCreate(handles_.hardware, &parsed_) != NVJPEG_STATUS_SUCCESS) {
        handles_.hardware = nullptr;
      }
    }
    return absl::OkStatus();
  }

  std::string backend() const override { return handles_.hardware ? "hardware" : "cuda"; }

  // Where image i of the current call goes in the device buffer (interleaved RGB).
  nvjpegImage_t Destination(size_t i) const {
    nvjpegImage_t d;
    std::memset(&d, 0, sizeof(d));
    d.channel[0] = device_buffer_ + offset_[i];
    d.pitch[0] = static_cast<size_t>((*images_)[i].width) * 3;
    return d;
  }
  const unsigned char* Bytes(size_t i) const {
    return reinterpret_cast<const unsigned char*>((*images_)[i].bytes->data());
  }

  // Images `hw` of the current call in one batch on the JPEG engines; false (the stream synchronised)
  // when the engines refuse one mid-batch.
  bool DecodeOnEngines(const std::vector<size_t>& hw) {
    std::vector<const unsigned char*> ptrs;
    std::vector<size_t> lengths;
    std::vector<nvjpegImage_t> dests;
    for (size_t i : hw) {
      ptrs.push_back(Bytes(i));
      lengths.push_back((*images_)[i].bytes->size());
      dests.push_back(Destination(i));
    }
    nvjpegStatus_t s = NVJPEG_STATUS_SUCCESS;
    if (static_cast<int>(hw.size()) != hw_batch_) {
      s = nvjpegDecodeBatchedInitialize(handles_.hardware, hw_state_, static_cast<int>(hw.size()), 1,
                                        NVJPEG_OUTPUT_RGBI);
      hw_batch_ = s == NVJPEG_STATUS_SUCCESS ? static_cast<int>(hw.size()) : 0;
    }
    if (s == NVJPEG_STATUS_SUCCESS) {
      s = nvjpegDecodeBatched(handles_.hardware, hw_state_, ptrs.data(), lengths.data(), dests.data(), stream_);
    }
    if (s == NVJPEG_STATUS_SUCCESS) return true;
    cudaStreamSynchronize(stream_);
    hw_batch_ = 0;
    return false;
  }

  void Start(std::vector<GpuJpegImage>* images) override {
    images_ = images;
    copy_error_ = cudaSuccess;
    if (images->empty()) return;
    if (cudaSetDevice(device_) != cudaSuccess) {
      for (GpuJpegImage& im : *images) im.status = absl::InternalError("cudaSetDevice failed");
      images_ = nullptr;
      return;
    }
    // One device buffer for the whole call; each image's pixels at its offset.
    std::vector<size_t>& offset = offset_;
    offset.assign(images->size(), 0);
    size_t total = 0;
    for (size_t i = 0; i < images->size(); ++i) {
      offset[i] = total;
      total += static_cast<size_t>((*images)[i].height) * (*images)[i].width * 3;
    }
    if (!Reserve(total)) {
      for (GpuJpegImage& im : *images) {
        im.status = absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", total, " bytes for JPEG decoding"));
      }
      images_ = nullptr;
      return;
    }
    auto data = [&](size_t i) { return Bytes(i); };
    // The streams the hardware engines take go there in one batch; the rest, one at a time.
    std::vector<size_t> hw, others;
    for (size_t i = 0; i < images->size(); ++i) {
      int unsupported = 1;
      if (handles_.hardware &&
          nvjpegJpegStreamParseHeader(handles_.hardware, data(i), (*images)[i].bytes->size(), parsed_) ==
              NVJPEG_STATUS_SUCCESS &&
          nvjpegDecodeBatchedSupported(handles_.hardware, parsed_, &unsupported) == NVJPEG_STATUS_SUCCESS &&
          unsupported == 0) {
        hw.push_back(i);
      } else {
        others.push_back(i);
      }
    }
    if (!hw.empty() && !DecodeOnEngines(hw)) {
      // A stream the engines refused mid-batch: decode the batch's images one by one instead.
      others.insert(others.end(), hw.begin(), hw.end());
    }
    for (size_t i : others) {
      nvjpegImage_t d = Destination(i);
      GpuJpegImage& im = (*images)[i];
      nvjpegStatus_t s =
          nvjpegDecode(handles_.cuda, cuda_state_, data(i), im.bytes->size(), NVJPEG_OUTPUT_RGBI, &d, stream_);
      if (s != NVJPEG_STATUS_SUCCESS) {
        im.status = absl::InvalidArgumentError(NvjpegError(("image '" + im.name + "' could not be decoded").c_str(), s));
      }
    }
    copy_error_ = cudaMemcpyAsync(host_buffer_, device_buffer_, total, cudaMemcpyDeviceToHost, stream_);
  }

  void Finish() override {
    if (images_ == nullptr) return;
    std::vector<GpuJpegImage>& images = *images_;
    images_ = nullptr;
    if (images.empty()) return;
    cudaError_t e = copy_error_;
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
    for (size_t i = 0; i < images.size(); ++i) {
      GpuJpegImage& im = images[i];
      if (e != cudaSuccess) {
        if (im.status.ok()) im.status = absl::InternalError(absl::StrCat("JPEG decoding on the GPU: ", cudaGetErrorString(e)));
        continue;
      }
      if (im.status.ok()) std::memcpy(im.out, host_buffer_ + offset_[i], static_cast<size_t>(im.height) * im.width * 3);
    }
  }

 private:
  bool Reserve(size_t bytes) {
    if (bytes <= capacity_) return true;
    if (device_buffer_) cudaFree(device_buffer_);
    if (host_buffer_) cudaFreeHost(host_buffer_);
    device_buffer_ = nullptr;
    host_buffer_ = nullptr;
    capacity_ = 0;
    const size_t want = bytes + bytes / 4;
    if (cudaMalloc(&device_buffer_, want) != cudaSuccess) return false;
    if (cudaMallocHost(&host_buffer_, want) != cudaSuccess) return false;
    capacity_ = want;
    return true;
  }

  const int device_;
  DeviceHandles handles_;
  cudaStream_t stream_ = nullptr;
  nvjpegJpegState_t hw_state_ = nullptr;
  nvjpegJpegState_t cuda_state_ = nullptr;
  nvjpegJpegStream_t parsed_ = nullptr;
  int hw_batch_ = 0;  // The batch size hw_state_ was initialised for.
  // Between Start and Finish.
  std::vector<GpuJpegImage>* images_ = nullptr;
  std::vector<size_t> offset_;
  cudaError_t copy_error_ = cudaSuccess;
  unsigned char* device_buffer_ = nullptr;
  unsigned char* host_buffer_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuJpegDecoder>> GpuJpegDecoder::Create(int device) {
  if (device < 0) return absl::UnavailableError("this worker runs on the CPU: no GPU to decode JPEG on; use --decode cpu");
  absl::StatusOr<DeviceHandles> handles = HandlesFor(device);
  if (!handles.ok()) return handles.status();
  auto decoder = std::make_unique<NvjpegDecoder>(device, *handles);
  absl::Status s = decoder->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<GpuJpegDecoder>(std::move(decoder));
}

#endif  // TALLY_NVJPEG

}  // namespace tally
