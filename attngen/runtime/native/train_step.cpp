// attngen's native training step: the prepared forward and backward of one call shape of
// attngen.attention(), run as a C++ autograd node.
//
// Why C++: a Python autograd node costs a training step 46-68 us of host time more than a C++ one
// (docs/performance/backward.md, "The floor of a Python backward node"): the engine runs a CUDA
// node's backward on its device thread, where a Python node must take the GIL. The Python runtime
// (attngen/runtime/kernel.py) stays the source of truth: it makes every first call, checks the
// inputs and lays out each launch's Params; this file only replays what it prepared (the same
// template bytes, pointer fields and launches) on new tensors of the same shapes, as
// Kernel._run does. Anything it was not prepared for (a misaligned pointer, another dout layout)
// goes back to attngen's own ops (attngen::attention, attngen::attention_backward) through the
// dispatcher.
//
// Built by attngen/runtime/native/__init__.py against the installed torch; loaded with
// torch.ops.load_library. No Python.h: the ops and the Step class are registered with torch's
// dispatcher and custom classes.

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cuda.h>
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace attngen_native {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// -- the CUDA driver, found in the libcuda.so.1 the process already has loaded ----------------------

struct Driver {
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                     void**, void**) = nullptr;
  CUresult (*launch_ex)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*get_context)(CUcontext*) = nullptr;
  CUresult (*set_context)(CUcontext) = nullptr;
  CUresult (*replace_address)(CUtensorMap*, void*) = nullptr;
  CUresult (*error_name)(CUresult, const char**) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
};

template <typename F>
void bind(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  TORCH_CHECK(fn != nullptr, "attngen native step: the CUDA driver has no ", name);
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    TORCH_CHECK(lib != nullptr, "attngen native step: cannot load libcuda.so.1");
    bind(lib, "cuLaunchKernel", d.launch);
    bind(lib, "cuLaunchKernelEx", d.launch_ex);
    bind(lib, "cuCtxGetCurrent", d.get_context);
    bind(lib, "cuCtxSetCurrent", d.set_context);
    bind(lib, "cuTensorMapReplaceAddress", d.replace_address);
    bind(lib, "cuGetErrorName", d.error_name);
    bind(lib, "cuGetErrorString", d.error_string);
  });
  return d;
}

// the driver's name and text of an error, as driver.error_text gives them to the Python runtime
std::string error_name(CUresult rc) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver().error_name(rc, &name) != CUDA_SUCCESS || name == nullptr) return "CUresult " + std::to_string(rc);
  if (driver().error_string(rc, &text) != CUDA_SUCCESS || text == nullptr) return name;
  return std::string(name) + ": " + text;
}

// A thread with no context current (autograd's device thread may have none) or another GPU's: `context`
// current for the guard's life, then the thread's own again (on the error paths too), as Kernel._run does.
class ContextCurrent {
 public:
  ContextCurrent(const Driver& d, CUcontext context) : d_(d) {
    CUresult rc = d_.get_context(&previous_);
    TORCH_CHECK(rc == CUDA_SUCCESS, "attngen: cuCtxGetCurrent failed: ", error_name(rc));
    if (previous_ != context) {
      rc = d_.set_context(context);
      TORCH_CHECK(rc == CUDA_SUCCESS, "attngen: cuCtxSetCurrent failed: ", error_name(rc));
      switched_ = true;
    }
  }
  ~ContextCurrent() {
    if (switched_) d_.set_context(previous_);
  }
  ContextCurrent(const ContextCurrent&) = delete;
  ContextCurrent& operator=(const ContextCurrent&) = delete;

 private:
  const Driver& d_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

// -- one prepared call: Params template, pointer fields, tensor maps, launches ----------------------

constexpr size_t kParamsMax = 4096;   // CUDA's limit for a kernel's parameters (driver.PARAMS_MAX)
constexpr int64_t kLoadBytes = 16;    // every pointer the kernels read in 16-byte vectors (kernel.LOAD_BYTES)

struct Launch {
  std::string name;
  CUfunction function;
  unsigned grid[3];
  unsigned threads;
  unsigned smem;
  bool programmatic;   // a programmatic dependent of the launch ahead of it (sm_90 on)
};

struct MapSlot {
  int64_t offset;      // of the 128-byte CUtensorMap in the Params
  int64_t pointer;     // index of the pointer it maps
  CUtensorMap map;     // encoded by the Python runtime for this shape; only its address changes
};

struct Program {
  std::vector<uint8_t> params;
  std::vector<int64_t> pointer_offsets;   // byte offset of each pointer field; -1: this Params omits it
  std::vector<MapSlot> maps;
  std::vector<Launch> launches;

  // Params, pointers patched in and maps re-addressed, launched on torch's current stream of `device`
  // with `context` (that device's primary context) current, as Kernel._run does. The context is made
  // current first: cuTensorMapReplaceAddress refuses a thread with none (CUDA_ERROR_INVALID_CONTEXT), and
  // autograd's device thread has none until a runtime call there makes one current.
  void run(const int64_t* pointers, int64_t device, CUcontext context) const {
    alignas(64) thread_local uint8_t buffer[kParamsMax];
    const Driver& d = driver();
    ContextCurrent in_context(d, context);
    std::memcpy(buffer, params.data(), params.size());
    for (size_t i = 0; i < pointer_offsets.size(); ++i) {
      if (pointer_offsets[i] >= 0) std::memcpy(buffer + pointer_offsets[i], &pointers[i], sizeof(int64_t));
    }
    for (const MapSlot& slot : maps) {
      alignas(64) CUtensorMap map = slot.map;
      CUresult rc = d.replace_address(&map, reinterpret_cast<void*>(pointers[slot.pointer]));
      TORCH_CHECK(rc == CUDA_SUCCESS, "attngen: cuTensorMapReplaceAddress failed: ", error_name(rc));
      std::memcpy(buffer + slot.offset, &map, sizeof(CUtensorMap));
    }
    CUstream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    void* args[1] = {buffer};
    for (const Launch& l : launches) {
      CUresult rc;
      if (l.programmatic) {
        CUlaunchAttribute attribute;
        std::memset(&attribute, 0, sizeof(attribute));
        attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig config;
        std::memset(&config, 0, sizeof(config));
        config.gridDimX = l.grid[0];
        config.gridDimY = l.grid[1];
        config.gridDimZ = l.grid[2];
        config.blockDimX = l.threads;
        config.blockDimY = config.blockDimZ = 1;
        config.sharedMemBytes = l.smem;
        config.hStream = stream;
        config.attrs = &attribute;
        config.numAttrs = 1;
        rc = d.launch_ex(&config, l.function, args, nullptr);
      } else {
        rc = d.launch(l.function, l.grid[0], l.grid[1], l.grid[2], l.threads, 1, 1, l.smem, stream, args, nullptr);
      }
      TORCH_CHECK(rc == CUDA_SUCCESS, "launch of ", l.name, " (grid=(", l.grid[0], ", ", l.grid[1], ", ", l.grid[2],
                  "), block=(", l.threads, ", 1, 1), dynamic smem=", l.smem, " B) failed: ", error_name(rc));
    }
  }
};

std::vector<uint8_t> bytes_of(const Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kByte && t.is_contiguous(),
              "attngen native step: bytes come as a contiguous uint8 CPU tensor");
  const uint8_t* p = t.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

// launches: 7 ints each (CUfunction, grid x, y, z, threads, dynamic smem bytes, programmatic)
Program program(const Tensor& params, const std::vector<int64_t>& pointer_offsets,
                const std::vector<int64_t>& map_offsets, const std::vector<int64_t>& map_pointers,
                const Tensor& maps, const std::vector<int64_t>& launches, const std::vector<std::string>& names) {
  Program p;
  p.params = bytes_of(params);
  TORCH_CHECK(p.params.size() <= kParamsMax, "attngen native step: Params of ", p.params.size(), " bytes");
  p.pointer_offsets = pointer_offsets;
  for (int64_t offset : pointer_offsets) {
    TORCH_CHECK(offset < 0 || offset + 8 <= static_cast<int64_t>(p.params.size()), "pointer field past the Params");
  }
  std::vector<uint8_t> map_bytes = bytes_of(maps);
  TORCH_CHECK(map_offsets.size() == map_pointers.size() && map_bytes.size() == map_offsets.size() * sizeof(CUtensorMap),
              "attngen native step: one 128-byte map per map field");
  for (size_t i = 0; i < map_offsets.size(); ++i) {
    TORCH_CHECK(map_offsets[i] % 64 == 0 && map_offsets[i] + 128 <= static_cast<int64_t>(p.params.size()) &&
                    map_pointers[i] >= 0 && map_pointers[i] < static_cast<int64_t>(pointer_offsets.size()),
                "attngen native step: map field ", i, " out of place");
    MapSlot slot;
    slot.offset = map_offsets[i];
    slot.pointer = map_pointers[i];
    std::memcpy(&slot.map, map_bytes.data() + i * sizeof(CUtensorMap), sizeof(CUtensorMap));
    p.maps.push_back(slot);
  }
  TORCH_CHECK(launches.size() == names.size() * 7, "attngen native step: 7 numbers per launch");
  for (size_t i = 0; i < names.size(); ++i) {
    const int64_t* l = launches.data() + i * 7;
    p.launches.push_back(Launch{names[i], reinterpret_cast<CUfunction>(l[0]),
                                {static_cast<unsigned>(l[1]), static_cast<unsigned>(l[2]), static_cast<unsigned>(l[3])},
                                static_cast<unsigned>(l[4]), static_cast<unsigned>(l[5]), l[6] != 0});
  }
  return p;
}

bool aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % kLoadBytes == 0; }

// -- the training step of one call shape ------------------------------------------------------------

using BackwardSignature = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                             const Tensor&, const Tensor&, const Tensor&, bool,
                                                             std::optional<c10::string_view>, std::optional<double>,
                                                             c10::string_view, bool);

// attngen::attention_backward, the plain call's: the Step's fallback calls it, the op kernel hands calls on to it
const c10::TypedOperatorHandle<BackwardSignature>& backward_handle() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("attngen::attention_backward", "").typed<BackwardSignature>();
  return op;
}

constexpr uint64_t kStepMagic = 0x6174746e67656e53ull;   // "attngenS": a handle that is a Step's address

struct Step : torch::CustomClassHolder {
  uint64_t magic = kStepMagic;
  int64_t device;
  CUcontext context;
  // the call's options, for attngen's own ops where this step was not prepared for the tensors
  bool causal;
  std::optional<std::string> alignment;
  std::optional<double> scale;
  std::string layout;
  bool deterministic;
  // a variant call's window and softcap (set_variants); its ALiBi slopes and sinks come with each call,
  // at the addresses the prepared Params read them at (the Python step's key holds them)
  bool variants = false;
  std::optional<std::vector<int64_t>> window;
  std::optional<double> softcap;
  Program forward_program, backward_program;
  std::vector<int64_t> lse_sizes;
  bool output_like_q = true;            // o as empty_like(q); else new contiguous with o_sizes
  std::vector<int64_t> o_sizes;
  int64_t scratch_floats = 0, sums_from = 0, sums_to = 0;
  std::vector<int64_t> turns;           // the deterministic call's int32 turn counters, or none
  std::vector<int64_t> dout_strides;    // the layout the backward was prepared for
  bool ready = false;

  Step(int64_t device, int64_t context, bool causal, std::optional<std::string> alignment,
       std::optional<double> scale, std::string layout, bool deterministic)
      : device(device), context(reinterpret_cast<CUcontext>(context)), causal(causal), alignment(std::move(alignment)),
        scale(scale), layout(std::move(layout)), deterministic(deterministic) {}
  // A freed Step's address fails step_at's check (while its memory holds no other Step).
  ~Step() { magic = 0; }

  void set_variants(std::optional<std::vector<int64_t>> window_, std::optional<double> softcap_) {
    variants = true;
    window = std::move(window_);
    softcap = softcap_;
  }

  void set_forward(const Tensor& params, std::vector<int64_t> pointer_offsets, std::vector<int64_t> map_offsets,
                   std::vector<int64_t> map_pointers, const Tensor& maps, std::vector<int64_t> launches,
                   std::vector<std::string> names, bool like_q, std::vector<int64_t> o_sizes_,
                   std::vector<int64_t> lse_sizes_) {
    TORCH_CHECK(pointer_offsets.size() == 5, "attngen native step: the forward patches q, k, v, o, lse");
    forward_program = program(params, pointer_offsets, map_offsets, map_pointers, maps, launches, names);
    output_like_q = like_q;
    o_sizes = std::move(o_sizes_);
    lse_sizes = std::move(lse_sizes_);
  }

  void set_backward(const Tensor& params, std::vector<int64_t> pointer_offsets, std::vector<int64_t> map_offsets,
                    std::vector<int64_t> map_pointers, const Tensor& maps, std::vector<int64_t> launches,
                    std::vector<std::string> names, std::vector<int64_t> scratch, std::vector<int64_t> turns_,
                    std::vector<int64_t> dout_strides_) {
    TORCH_CHECK(pointer_offsets.size() == 12, "attngen native step: the backward patches 12 pointers");
    TORCH_CHECK(scratch.size() == 3 && 0 <= scratch[1] && scratch[1] <= scratch[2] && scratch[2] <= scratch[0],
                "attngen native step: scratch is (floats, sums from, sums to)");
    backward_program = program(params, pointer_offsets, map_offsets, map_pointers, maps, launches, names);
    scratch_floats = scratch[0];
    sums_from = scratch[1];
    sums_to = scratch[2];
    turns = std::move(turns_);
    dout_strides = std::move(dout_strides_);
    ready = true;
  }

  // (o, lse); attngen's own forward op where a pointer is not 16-byte aligned
  std::tuple<Tensor, Tensor> forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const std::optional<Tensor>& alibi_slopes = std::nullopt,
                                     const std::optional<Tensor>& sinks = std::nullopt) const {
    if (!(aligned(q) && aligned(k) && aligned(v))) {
      if (variants) {
        static auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attngen::attention_variant", "")
                             .typed<std::tuple<Tensor, Tensor>(
                                 const Tensor&, const Tensor&, const Tensor&, bool, std::optional<c10::string_view>,
                                 std::optional<double>, c10::string_view, at::OptionalIntArrayRef,
                                 std::optional<double>, const std::optional<Tensor>&, const std::optional<Tensor>&)>();
        return op.call(q, k, v, causal, alignment, scale, layout, window_ref(), softcap, alibi_slopes, sinks);
      }
      static auto op = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("attngen::attention", "")
                           .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool,
                                                             std::optional<c10::string_view>, std::optional<double>,
                                                             c10::string_view)>();
      return op.call(q, k, v, causal, alignment, scale, layout);
    }
    Tensor o = output_like_q ? at::empty_like(q) : at::empty(o_sizes, q.options());
    Tensor lse = at::empty(lse_sizes, q.options().dtype(at::kFloat));
    const int64_t pointers[5] = {ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse)};
    forward_program.run(pointers, device, context);
    return {o, lse};
  }

  // (dq, dk, dv, delta): delta = rowsum(dO * O) per query row, fp32 like lse (the preprocess kernel's,
  // a view of the scratch; computed here where attngen's own backward op serves the call), undefined
  // unless asked for. attngen's own backward op for tensors of another layout or misaligned.
  std::tuple<Tensor, Tensor, Tensor, Tensor> backward(Tensor dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                                      const Tensor& o, const Tensor& lse,
                                                      const std::optional<Tensor>& alibi_slopes = std::nullopt,
                                                      bool return_delta = false) const {
    if (dout.strides() != c10::IntArrayRef(dout_strides)) dout = dout.contiguous();
    if (dout.strides() != c10::IntArrayRef(dout_strides) ||
        !(aligned(q) && aligned(k) && aligned(v) && aligned(o) && aligned(dout))) {
      auto [dq, dk, dv] = backward_op(dout, q, k, v, o, lse, alibi_slopes);
      if (!return_delta) return {dq, dk, dv, Tensor()};
      Tensor rows = (dout.to(at::kFloat) * o.to(at::kFloat)).sum(-1);   // (B, H, S), or (B, S, H) for bshd
      return {dq, dk, dv, layout == "bshd" ? rows.transpose(1, 2) : rows};
    }
    Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    // [dQ accumulator | group-split sums of dK and dV | delta] (backward.scratch_layout); the
    // preprocess kernel zeroes the accumulator and writes delta, the sums are zeroed here
    Tensor buffer = at::empty({scratch_floats}, q.options().dtype(at::kFloat));
    if (sums_to > sums_from) buffer.narrow(0, sums_from, sums_to - sums_from).zero_();
    Tensor turn_counts = turns.empty() ? Tensor() : at::zeros(turns, q.options().dtype(at::kInt));
    const int64_t base = ptr(buffer);
    const int64_t pointers[12] = {ptr(q),  ptr(k),  ptr(v), ptr(o), ptr(lse), ptr(dout), ptr(dq), ptr(dk),
                                  ptr(dv), base, base + 4 * sums_to, turns.empty() ? 0 : ptr(turn_counts)};
    backward_program.run(pointers, device, context);
    if (!return_delta) return {dq, dk, dv, Tensor()};
    return {dq, dk, dv, buffer.narrow(0, sums_to, lse.numel()).view(lse_sizes)};
  }

  std::tuple<Tensor, Tensor, Tensor> backward_op(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const Tensor& o, const Tensor& lse,
                                                 const std::optional<Tensor>& alibi_slopes) const {
    if (variants) {
      static auto op = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("attngen::attention_variant_backward", "")
                           .typed<std::tuple<Tensor, Tensor, Tensor>(
                               const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, bool, std::optional<c10::string_view>, std::optional<double>,
                               c10::string_view, at::OptionalIntArrayRef, std::optional<double>,
                               const std::optional<Tensor>&, bool)>();
      return op.call(dout, q, k, v, o, lse, causal, alignment, scale, layout, window_ref(), softcap, alibi_slopes,
                     deterministic);
    }
    return backward_handle().call(dout, q, k, v, o, lse, causal, alignment, scale, layout, deterministic);
  }

  // The ops take a Step by its address, an int: a custom-class argument costs the dispatcher's boxed
  // call from Python about 7 us more than an int (measured on the development CPU, torch 2.13).
  int64_t address() const { return reinterpret_cast<int64_t>(this); }

  at::OptionalIntArrayRef window_ref() const {
    return window ? at::OptionalIntArrayRef(*window) : at::OptionalIntArrayRef();
  }

  static int64_t ptr(const Tensor& t) { return reinterpret_cast<int64_t>(t.data_ptr()); }
};

// d loss / d sinks from the backward's delta: head h's sink takes weight exp(sink - LSE) in each row and
// its gradient is -weight * delta, summed over batch and rows (library.sink_gradient_from_delta)
Tensor sink_gradient(const Tensor& delta, const Tensor& lse, const Tensor& sinks) {
  Tensor weight = (sinks.reshape({1, -1, 1}) - lse).exp_();
  static const int64_t batch_and_rows[] = {0, 2};   // an IntArrayRef: a braced list is ambiguous with DimnameList
  return weight.mul_(delta).sum(at::IntArrayRef(batch_and_rows)).neg_();
}

// -- the autograd node ------------------------------------------------------------------------------

struct Train : public torch::autograd::Function<Train> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const std::optional<Tensor>& alibi_slopes, const std::optional<Tensor>& sinks,
                               const c10::intrusive_ptr<Step>& step) {
    auto [o, lse] = step->forward(q, k, v, alibi_slopes, sinks);
    // the slopes and sinks are saved too: a backward after they changed in place is refused, as the ops'
    ctx->save_for_backward({q, k, v, o, lse, alibi_slopes.value_or(Tensor()), sinks.value_or(Tensor())});
    ctx->saved_data["step"] = step;
    ctx->saved_data["sinks_grad"] = sinks.has_value() && sinks->defined() && sinks->requires_grad();
    ctx->mark_non_differentiable({lse});
    // the LSE takes no gradient: no tensor of zeros for it each step (as _PreparedTrain)
    ctx->set_materialize_grads(false);
    return {o, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    auto saved = ctx->get_saved_variables();
    auto step = ctx->saved_data["step"].toCustomClass<Step>();
    bool sinks_grad = ctx->saved_data["sinks_grad"].toBool();
    std::optional<Tensor> alibi_slopes;
    if (saved[5].defined()) alibi_slopes = saved[5];
    auto [dq, dk, dv, delta] =
        step->backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], alibi_slopes, sinks_grad);
    Tensor dsinks = sinks_grad ? sink_gradient(delta, saved[4], saved[6]) : Tensor();
    return {dq, dk, dv, Tensor(), dsinks, Tensor()};
  }
};

// The Step at `address` (Step::address of one the caller keeps alive for the call): checked, as far as a
// word can, to be one
const Step* step_at(int64_t address) {
  const Step* step = reinterpret_cast<const Step*>(address);
  TORCH_CHECK(step != nullptr && step->magic == kStepMagic && step->ready,
              "attngen native step: ", address, " is not a ready Step's address");
  return step;
}

std::tuple<Tensor, Tensor> train(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const std::optional<Tensor>& alibi_slopes, const std::optional<Tensor>& sinks,
                                 int64_t address) {
  // the node keeps its own reference: the step outlives the caller's for the backward
  auto step = c10::intrusive_ptr<Step>::unsafe_reclaim_from_nonowning(const_cast<Step*>(step_at(address)));
  auto out = Train::apply(q, k, v, alibi_slopes, sinks, step);
  return {out[0], out[1]};
}

// torch.compile's graphs call attngen::attention_train and attngen::attention_backward, whose CUDA
// implementations (Python) hand a prepared shape to these: the step's forward and backward alone.
std::tuple<Tensor, Tensor> forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t address) {
  const Step* step = step_at(address);
  TORCH_CHECK(!step->variants, "attngen native step: a variant call's step takes attngen_native::train");
  return step->forward(q, k, v);
}

std::tuple<Tensor, Tensor, Tensor> backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& o, const Tensor& lse, int64_t address) {
  const Step* step = step_at(address);
  TORCH_CHECK(!step->variants, "attngen native step: a variant call's step takes attngen_native::train");
  auto [dq, dk, dv, delta] = step->backward(dout, q, k, v, o, lse);
  return {dq, dk, dv};
}

// -- attngen's own training ops, served here for the shapes that have a native step -------------------
//
// A torch.compile graph calls attngen::attention_train and attngen::attention_backward; through Python
// each call costs the op's Python autograd kernel (register_autograd's), the CUDA implementation in
// Python and its step lookup before it reaches the step's forward or backward above. take_ops puts a C++
// kernel ahead of them: attention_train's at AutogradCUDA (ahead of the Python autograd kernel, which
// is registered for the Autograd alias and stays registered), attention_backward's at ADInplaceOrView
// (below torch's autograd fallback, above its CUDA implementation). Each finds the call's step by the
// key the Python ops find it by (shapes, strides, dtypes, devices, options: call_key in
// runtime/calls/shared.py), among the steps Python registered (register_plain), and replays it where
// the Python op would have; every other call goes on to the Python kernels it would have reached:
// a call that needs a gradient to the Python autograd kernel, the rest redispatched below.

// What call_key holds of a plain training call; the tensors 4-D
struct CallKey {
  std::array<int64_t, 24> layout{};   // q, k, v: sizes then strides
  std::array<int64_t, 3> dtypes{};
  std::array<int64_t, 3> devices{};
  bool causal = false;
  bool deterministic = false;
  std::optional<std::string> alignment;
  std::optional<double> scale;
  std::string layout_name;

  bool operator==(const CallKey& o) const {
    return layout == o.layout && dtypes == o.dtypes && devices == o.devices && causal == o.causal &&
           deterministic == o.deterministic && alignment == o.alignment && scale == o.scale &&
           layout_name == o.layout_name;
  }
};

struct CallKeyHash {
  size_t operator()(const CallKey& k) const {
    size_t h = std::hash<std::string>()(k.layout_name) ^ (k.causal ? 0x9e37u : 0u) ^ (k.deterministic ? 0x79b9u : 0u);
    auto mix = [&h](int64_t v) { h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : k.layout) mix(v);
    for (int64_t v : k.dtypes) mix(v);
    for (int64_t v : k.devices) mix(v);
    return h;
  }
};

// The key of a call, or none where a tensor is not 4-D (no step serves it)
std::optional<CallKey> call_key(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                std::optional<c10::string_view> alignment, std::optional<double> scale,
                                c10::string_view layout, bool deterministic) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return std::nullopt;
  CallKey key;
  const Tensor* tensors[3] = {&q, &k, &v};
  for (int t = 0; t < 3; ++t) {
    for (int d = 0; d < 4; ++d) {
      key.layout[t * 8 + d] = tensors[t]->size(d);
      key.layout[t * 8 + 4 + d] = tensors[t]->stride(d);
    }
    key.dtypes[t] = static_cast<int64_t>(tensors[t]->scalar_type());
    key.devices[t] = tensors[t]->get_device();
  }
  key.causal = causal;
  key.deterministic = deterministic;
  if (alignment) key.alignment = std::string(*alignment);
  key.scale = scale;
  key.layout_name = std::string(layout);
  return key;
}

// A registered step with the strides of the outputs its forward's prepared call was laid out for (the
// Python step's output_strides: its backward replays only on those)
struct Served {
  c10::intrusive_ptr<Step> step;
  std::vector<int64_t> o_strides, lse_strides;
};

struct Registry {
  std::mutex lock;
  std::unordered_map<CallKey, std::shared_ptr<const Served>, CallKeyHash> steps;
};

Registry& registry() {
  static Registry* r = new Registry();   // never destroyed: a kernel may run while the process exits
  return *r;
}

std::shared_ptr<const Served> find_step(const std::optional<CallKey>& key) {
  if (!key) return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> hold(r.lock);
  auto it = r.steps.find(*key);
  return it == r.steps.end() ? nullptr : it->second;
}

// The step at `address` (a plain call's: no variants) serves calls of q, k and v's key with its own
// options; a later registration under the same key replaces it (the Python ops may have made two steps
// of one key on two threads: either replays the call alike)
void register_plain(int64_t address, const Tensor& q, const Tensor& k, const Tensor& v, std::vector<int64_t> o_strides,
                    std::vector<int64_t> lse_strides) {
  const Step* step = step_at(address);
  TORCH_CHECK(!step->variants, "attngen native step: only a plain call's step serves attngen's training ops");
  auto key = call_key(q, k, v, step->causal, step->alignment, step->scale, step->layout, step->deterministic);
  TORCH_CHECK(key.has_value(), "attngen native step: q, k and v of a step are 4-D");
  auto served = std::make_shared<Served>();
  served->step = c10::intrusive_ptr<Step>::unsafe_reclaim_from_nonowning(const_cast<Step*>(step));
  served->o_strides = std::move(o_strides);
  served->lse_strides = std::move(lse_strides);
  Registry& r = registry();
  std::lock_guard<std::mutex> hold(r.lock);
  r.steps[*key] = std::move(served);
}

// Python forgot its steps (its cache was emptied): so does the registry
void forget_steps() {
  Registry& r = registry();
  std::lock_guard<std::mutex> hold(r.lock);
  r.steps.clear();
}

int64_t steps_served() {
  Registry& r = registry();
  std::lock_guard<std::mutex> hold(r.lock);
  return static_cast<int64_t>(r.steps.size());
}

// The address of the step that serves this call, or 0 (the tests check the key against Python's)
int64_t served_step(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                    std::optional<c10::string_view> alignment, std::optional<double> scale, c10::string_view layout,
                    bool deterministic) {
  auto served = find_step(call_key(q, k, v, causal, alignment, scale, layout, deterministic));
  return served ? served->step->address() : 0;
}

// How the kernels took each call since the library loaded (op_counts): replayed, handed to the Python
// autograd kernel (attention_train's calls that need a gradient), handed below
enum Count { kTrainReplayed, kTrainToAutograd, kTrainBelow, kBackwardReplayed, kBackwardBelow, kCounts };
std::array<std::atomic<int64_t>, kCounts> op_calls{};

void count(Count c) { op_calls[c].fetch_add(1, std::memory_order_relaxed); }

std::vector<int64_t> op_counts() {
  std::vector<int64_t> counts;
  for (const auto& c : op_calls) counts.push_back(c.load(std::memory_order_relaxed));
  return counts;
}

// Whether the keys in `below` reach the CUDA kernel directly: real CUDA tensors, with no Python
// (fake tensors, tracing modes), functionalization or other layer between: only they may be replayed
bool reaches_cuda(c10::DispatchKeySet ks, c10::DispatchKeySet below) {
  return (ks & below).highestPriorityTypeId() == c10::DispatchKey::CUDA;
}

using TrainSignature = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool,
                                                  std::optional<c10::string_view>, std::optional<double>,
                                                  c10::string_view, bool);

const c10::OperatorHandle& train_handle() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("attngen::attention_train", "");
  return op;
}

std::tuple<Tensor, Tensor> attention_train_kernel(c10::DispatchKeySet ks, const Tensor& q, const Tensor& k,
                                                  const Tensor& v, bool causal,
                                                  std::optional<c10::string_view> alignment,
                                                  std::optional<double> scale, c10::string_view layout,
                                                  bool deterministic) {
  if (c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    // a call that records a gradient: the Python autograd kernel, as before (boxed, as the dispatcher calls it)
    torch::jit::Stack stack;
    stack.reserve(8);
    stack.emplace_back(q);
    stack.emplace_back(k);
    stack.emplace_back(v);
    stack.emplace_back(causal);
    stack.emplace_back(alignment ? c10::IValue(std::string(*alignment)) : c10::IValue());
    stack.emplace_back(scale ? c10::IValue(*scale) : c10::IValue());
    stack.emplace_back(std::string(layout));
    stack.emplace_back(deterministic);
    count(kTrainToAutograd);
    train_handle().callBoxedForDispatchKey(c10::DispatchKey::Autograd, stack);
    return {stack[0].toTensor(), stack[1].toTensor()};
  }
  // below autograd, as the Python autograd kernel runs a call without a gradient
  at::AutoDispatchBelowAutograd below;
  if (reaches_cuda(ks, c10::after_ADInplaceOrView_keyset)) {
    if (auto served = find_step(call_key(q, k, v, causal, alignment, scale, layout, deterministic))) {
      count(kTrainReplayed);
      return served->step->forward(q, k, v);
    }
  }
  count(kTrainBelow);
  static auto op = train_handle().typed<TrainSignature>();
  return op.redispatch(ks & c10::after_autograd_keyset, q, k, v, causal, alignment, scale, layout, deterministic);
}

std::tuple<Tensor, Tensor, Tensor> attention_backward_kernel(c10::DispatchKeySet ks, const Tensor& dout,
                                                             const Tensor& q, const Tensor& k, const Tensor& v,
                                                             const Tensor& out, const Tensor& lse, bool causal,
                                                             std::optional<c10::string_view> alignment,
                                                             std::optional<double> scale, c10::string_view layout,
                                                             bool deterministic) {
  if (reaches_cuda(ks, c10::after_ADInplaceOrView_keyset)) {
    auto served = find_step(call_key(q, k, v, causal, alignment, scale, layout, deterministic));
    // where the Python op replays the native step: out and lse of its forward's strides, dout of the
    // backward's, every pointer the kernels read on 16 bytes (attention_backward_cuda)
    if (served && out.strides() == c10::IntArrayRef(served->o_strides) &&
        lse.strides() == c10::IntArrayRef(served->lse_strides) &&
        dout.strides() == c10::IntArrayRef(served->step->dout_strides) && aligned(q) && aligned(k) && aligned(v) &&
        aligned(out) && aligned(dout)) {
      count(kBackwardReplayed);
      auto [dq, dk, dv, delta] = served->step->backward(dout, q, k, v, out, lse);
      return {dq, dk, dv};
    }
  }
  count(kBackwardBelow);
  return backward_handle().redispatch(ks & c10::after_ADInplaceOrView_keyset, dout, q, k, v, out, lse, causal,
                                      alignment, scale, layout, deterministic);
}

// The registrations take_ops made, undone by release_ops (the tests'); one at a time
std::mutex ops_lock;
std::vector<std::unique_ptr<torch::Library>> taken_ops;

// Serve attngen's training ops from here (once; again after release_ops). cpu_too: attention_train's
// kernel also for CPU tensors, where it only hands calls on (the tests' CPU stand-ins of the ops)
void take_ops(bool cpu_too) {
  std::lock_guard<std::mutex> hold(ops_lock);
  if (!taken_ops.empty()) return;
  // the calls that need a gradient go to this kernel (register_autograd's); without it they could not
  TORCH_CHECK(train_handle().hasKernelForDispatchKey(c10::DispatchKey::Autograd),
              "attngen native step: attngen::attention_train has no autograd kernel to hand calls to");
  auto train = std::make_unique<torch::Library>(torch::Library::IMPL, "attngen", c10::DispatchKey::AutogradCUDA,
                                                __FILE__, __LINE__);
  train->impl("attention_train", TORCH_FN(attention_train_kernel));
  taken_ops.push_back(std::move(train));
  if (cpu_too) {
    auto cpu = std::make_unique<torch::Library>(torch::Library::IMPL, "attngen", c10::DispatchKey::AutogradCPU,
                                                __FILE__, __LINE__);
    cpu->impl("attention_train", TORCH_FN(attention_train_kernel));
    taken_ops.push_back(std::move(cpu));
  }
  auto backward = std::make_unique<torch::Library>(torch::Library::IMPL, "attngen", c10::DispatchKey::ADInplaceOrView,
                                                   __FILE__, __LINE__);
  backward->impl("attention_backward", TORCH_FN(attention_backward_kernel));
  taken_ops.push_back(std::move(backward));
}

void release_ops() {
  std::lock_guard<std::mutex> hold(ops_lock);
  taken_ops.clear();
}

// The build's self-test (runtime/native self_test): a failed check whose message formats a number must reach
// Python as RuntimeError. A library carrying a C++ runtime of its own would end the process here instead.
int64_t check_message(int64_t value) {
  TORCH_CHECK(value == 0, "attngen native step: self-test ", value);
  return value;
}

}  // namespace attngen_native

TORCH_LIBRARY(attngen_native, m) {
  m.class_<attngen_native::Step>("Step")
      .def(torch::init<int64_t, int64_t, bool, std::optional<std::string>, std::optional<double>, std::string,
                       bool>())
      .def("address", &attngen_native::Step::address)
      .def("set_variants", &attngen_native::Step::set_variants)
      .def("set_forward", &attngen_native::Step::set_forward)
      .def("set_backward", &attngen_native::Step::set_backward);
  m.def("train(Tensor q, Tensor k, Tensor v, Tensor? alibi_slopes, Tensor? sinks, int step) -> (Tensor, Tensor)");
  m.def("forward(Tensor q, Tensor k, Tensor v, int step) -> (Tensor, Tensor)");
  m.def("backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, int step) -> (Tensor, Tensor, Tensor)");
  m.def("check_message(int value) -> int", &attngen_native::check_message);
  m.def("register_plain(int step, Tensor q, Tensor k, Tensor v, int[] o_strides, int[] lse_strides) -> ()",
        &attngen_native::register_plain);
  m.def("forget_steps() -> ()", &attngen_native::forget_steps);
  m.def("steps_served() -> int", &attngen_native::steps_served);
  m.def("served_step(Tensor q, Tensor k, Tensor v, bool causal, str? alignment, float? scale, str layout, "
        "bool deterministic) -> int",
        &attngen_native::served_step);
  m.def("take_ops(bool cpu_too=False) -> ()", &attngen_native::take_ops);
  m.def("release_ops() -> ()", &attngen_native::release_ops);
  m.def("op_counts() -> int[]", &attngen_native::op_counts);
}

TORCH_LIBRARY_IMPL(attngen_native, Autograd, m) { m.impl("train", &attngen_native::train); }

TORCH_LIBRARY_IMPL(attngen_native, CUDA, m) {
  m.impl("forward", &attngen_native::forward);
  m.impl("backward", &attngen_native::backward);
}
