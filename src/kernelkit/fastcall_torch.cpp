// The fast call path's use of libtorch's C++ API, lent to fastcall.cpp (its set_torch).
//
// fastcall.cpp includes only Python.h, so that a wheel can carry it built: it reads tensors and
// allocates outputs through torch's Python methods, which costs a repeated GPU call ~2 us of
// host time (torch.empty_like alone ~1.5 us, mostly argument parsing). These functions do the
// same in C++: a tensor's fields read off at::Tensor, outputs made as torch.empty makes them. They
// need the installed torch's headers and C++ ABI, which change with each release, so
// fastcall.py builds this file at run time against that torch (as torch's own extensions are
// built) and keeps it in the compile cache. Nothing here is CUDA's, so the same file builds
// against a CPU-only torch: the current stream is read as its id through c10's device-neutral
// API (its native handle is not CUDA's in every torch), which fastcall.cpp maps to the handle.
//
// Every function is called with the GIL held; one that fails returns its failure value with a
// Python exception set (torch's own, through HANDLE_TH_ERRORS: an out-of-memory stays
// torch.OutOfMemoryError).
#include <Python.h>

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <utility>
#include <vector>

#define KK_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// torch.device objects, made once per device: a plan key holds one for each tensor input, and
// making one costs as much as the rest of the key.
PyObject* device_object(const c10::Device& device) {
  static std::vector<std::pair<c10::Device, PyObject*>> made;
  for (const auto& [d, o] : made)
    if (d == device) return Py_NewRef(o);
  PyObject* o = THPDevice_New(device);
  if (o != nullptr) made.emplace_back(device, Py_NewRef(o));
  return o;
}

bool unpack(PyObject* o, const at::Tensor** out) {
  if (!THPVariable_Check(o)) {
    PyErr_Format(PyExc_TypeError, "expected a torch.Tensor, got %s", Py_TYPE(o)->tp_name);
    return false;
  }
  *out = &THPVariable_Unpack(o);
  return true;
}

// A new contiguous tensor as at::empty makes it, less the dispatcher (~0.4 us of a GPU host's
// ~0.8): at::empty's CPU and CUDA kernels are empty_generic with the device's allocator, which
// the prototype's storage holds (torch.empty made it: a swapped CUDA allocator is that one),
// on the prototype's device (the CUDA allocator allocates on the current one). at::empty itself
// where more than that takes part: a TorchDispatchMode, deterministic fill of new memory.
at::Tensor new_like(const at::Tensor& prototype, c10::IntArrayRef sizes) {
  c10::Allocator* allocator = prototype.storage().unsafeGetStorageImpl()->allocator();
  const at::Context& context = at::globalContext();
  if (allocator == nullptr || c10::impl::TorchDispatchModeTLS::any_modes_set() ||
      (context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory()))
    return at::empty(sizes, prototype.options());
  c10::DeviceGuard guard(prototype.device());
  c10::DispatchKeySet backend(
      c10::computeDispatchKey(prototype.scalar_type(), prototype.layout(), prototype.device()));
  return at::detail::empty_generic(sizes, allocator, backend, prototype.scalar_type(), std::nullopt);
}

}  // namespace

// (dtype, device, dim(), is_contiguous(), requires_grad) of a tensor, as kernel._plan_key.
KK_EXPORT PyObject* kk_fingerprint(PyObject* o) {
  HANDLE_TH_ERRORS
  const at::Tensor* t;
  if (!unpack(o, &t)) return nullptr;
  PyObject* device = device_object(t->device());
  PyObject* dim = device ? PyLong_FromLongLong(t->dim()) : nullptr;
  PyObject* fp = dim ? PyTuple_New(5) : nullptr;
  if (fp == nullptr) {
    Py_XDECREF(device);
    Py_XDECREF(dim);
    return nullptr;
  }
  PyTuple_SET_ITEM(fp, 0, Py_NewRef(reinterpret_cast<PyObject*>(torch::getTHPDtype(t->scalar_type()))));
  PyTuple_SET_ITEM(fp, 1, device);
  PyTuple_SET_ITEM(fp, 2, dim);
  PyTuple_SET_ITEM(fp, 3, Py_NewRef(t->is_contiguous() ? Py_True : Py_False));
  PyTuple_SET_ITEM(fp, 4, Py_NewRef(t->requires_grad() ? Py_True : Py_False));
  return fp;
  END_HANDLE_TH_ERRORS
}

// A tensor's data pointer, and its sizes and strides (pointers into the tensor, valid while it
// lives): its ndim, or -1.
KK_EXPORT int64_t kk_view(PyObject* o, void** data, const int64_t** sizes, const int64_t** strides) {
  HANDLE_TH_ERRORS
  const at::Tensor* t;
  if (!unpack(o, &t)) return -1;
  *data = t->data_ptr();
  *sizes = t->sizes().data();
  *strides = t->strides().data();
  return t->dim();
  END_HANDLE_TH_ERRORS_RET(-1)
}

// A new contiguous tensor of `prototype`'s dtype and device with these sizes (torch.empty).
KK_EXPORT PyObject* kk_empty(PyObject* prototype, const int64_t* sizes, int64_t ndim) {
  HANDLE_TH_ERRORS
  const at::Tensor* p;
  if (!unpack(prototype, &p)) return nullptr;
  return THPVariable_Wrap(new_like(*p, c10::IntArrayRef(sizes, static_cast<size_t>(ndim))));
  END_HANDLE_TH_ERRORS
}

// The id of torch's current stream on CUDA device `index`, as c10 numbers streams (what
// torch.cuda.current_stream(index).stream_id says): 0, or -1 with an exception set.
KK_EXPORT int kk_stream(int64_t index, int64_t* id) {
  HANDLE_TH_ERRORS
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
  *id = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).id();
  return 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}

// A tensor's fingerprint (kk_fingerprint's) in one word, for fastcall.cpp to compare with the
// last call's: dtype, device type and index, requires_grad, is_contiguous() and dim(). The
// tensor is a torch.Tensor (fastcall.cpp checks its type).
KK_EXPORT int64_t kk_signature(PyObject* o) {
  const at::Tensor& t = THPVariable_Unpack(o);
  const c10::Device device = t.device();
  return static_cast<int64_t>(static_cast<uint8_t>(t.scalar_type())) |
         static_cast<int64_t>(static_cast<uint8_t>(device.type())) << 8 |
         static_cast<int64_t>(static_cast<uint8_t>(device.index())) << 16 |
         static_cast<int64_t>(t.requires_grad()) << 24 | static_cast<int64_t>(t.is_contiguous()) << 25 |
         t.dim() << 26;
}
