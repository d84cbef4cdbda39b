// kernelkit's fast call path in C (kernel.py's plans; fastcall.py builds and loads this file).
//
// `call` reads a repeated call's plan key off its arguments and runs the plan; `run` is a whole
// plan: allocate the outputs, pack the argument block from the tensors' pointers, then on CUDA
// cuLaunchKernel on torch's current stream (Python and cuda-bindings take ~2x the host time for
// the same steps), on the CPU the kernel library's kk_launch (ctypes and kernel.py's plan took
// ~5x). The driver's entry points come from cuda-bindings' cuGetProcAddress
// (set_driver), so this file links nothing and includes no CUDA header: the typedefs below are
// the driver API's stable C ABI. It includes no torch header either (a wheel carries it built,
// whatever torch is installed): tensors are read and outputs allocated through torch's Python
// methods until fastcall_torch.cpp, built against the installed torch, lends the same steps in
// C++ (set_torch), which halves a repeated call's host time.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using CUresult = int;
using CUcontext = void*;
using CUfunction = void*;
using CUstream = void*;
using LaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void**, void**);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using CtxPush = CUresult (*)(CUcontext);
using CtxPop = CUresult (*)(CUcontext*);
using CUdeviceptr = unsigned long long;
using MemsetD8 = CUresult (*)(CUdeviceptr, unsigned char, size_t, CUstream);
using MemsetD16 = CUresult (*)(CUdeviceptr, unsigned short, size_t, CUstream);
using MemsetD32 = CUresult (*)(CUdeviceptr, unsigned, size_t, CUstream);
// The CPU backend's entry of a kernel library (kk_launch): block, launch description, message
// buffer and its size -> 0, or not with the message written.
using CpuLaunch = int (*)(const char*, const void*, char*, size_t);

LaunchKernel launch_kernel = nullptr;
CtxGetCurrent ctx_get_current = nullptr;
CtxPush ctx_push = nullptr;
CtxPop ctx_pop = nullptr;
MemsetD8 memset_d8 = nullptr;
MemsetD16 memset_d16 = nullptr;
MemsetD32 memset_d32 = nullptr;

void* as_pointer(PyObject* o) { return PyLong_AsVoidPtr(o); }

unsigned as_unsigned(PyObject* o) { return static_cast<unsigned>(PyLong_AsUnsignedLong(o)); }

// set_driver(cuLaunchKernel, cuCtxGetCurrent, cuCtxPushCurrent, cuCtxPopCurrent,
//            cuMemsetD8Async, cuMemsetD16Async, cuMemsetD32Async): addresses.
PyObject* set_driver(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "set_driver expects 7 function addresses");
    return nullptr;
  }
  launch_kernel = reinterpret_cast<LaunchKernel>(as_pointer(args[0]));
  ctx_get_current = reinterpret_cast<CtxGetCurrent>(as_pointer(args[1]));
  ctx_push = reinterpret_cast<CtxPush>(as_pointer(args[2]));
  ctx_pop = reinterpret_cast<CtxPop>(as_pointer(args[3]));
  memset_d8 = reinterpret_cast<MemsetD8>(as_pointer(args[4]));
  memset_d16 = reinterpret_cast<MemsetD16>(as_pointer(args[5]));
  memset_d32 = reinterpret_cast<MemsetD32>(as_pointer(args[6]));
  if (PyErr_Occurred()) return nullptr;
  Py_RETURN_NONE;
}

// f() with `ctx` made current for it when it is not already (torch's current device may be
// another).
template <class F> CUresult in_context(CUcontext ctx, F&& f) {
  CUcontext current = nullptr;
  CUresult err = ctx_get_current(&current);
  bool pushed = false;
  if (err == 0 && current != ctx) {
    err = ctx_push(ctx);
    pushed = err == 0;
  }
  if (err == 0) err = f();
  if (pushed) {
    CUcontext popped;
    CUresult pop_err = ctx_pop(&popped);
    if (err == 0) err = pop_err;
  }
  return err;
}

CUresult launch_in_context(CUfunction fn, CUcontext ctx, const unsigned* dims, CUstream stream,
                           void** params) {
  return in_context(ctx, [&] {
    return launch_kernel(fn, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], stream, params,
                         nullptr);
  });
}

// `count` units of `unit` bytes (1, 2 or 4) from `data`, each `pattern`, on the stream: an
// init_value's fill of a new output, which torch's fill_ makes ~4x dearer on the host.
CUresult memset_in_context(CUcontext ctx, void* data, int unit, unsigned pattern, size_t count, CUstream stream) {
  const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(data);
  return in_context(ctx, [&] {
    return unit == 4   ? memset_d32(p, pattern, count, stream)
           : unit == 2 ? memset_d16(p, static_cast<unsigned short>(pattern), count, stream)
                       : memset_d8(p, static_cast<unsigned char>(pattern), count, stream);
  });
}

// launch(function, context, blocks_x, blocks_y, blocks_z, threads_x, threads_y, threads_z,
//        shared_bytes, stream, block) -> CUresult as int.
// `block` is the packed argument block (bytes): the kernel's one by-value parameter. The
// context is made current for the launch when it is not already (torch's device may differ).
PyObject* launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 11 || !PyBytes_Check(args[10])) {
    PyErr_SetString(PyExc_TypeError, "launch expects 10 ints and the argument block (bytes)");
    return nullptr;
  }
  if (launch_kernel == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "kernelkit's CUDA launcher has no driver entry points");
    return nullptr;
  }
  CUfunction fn = as_pointer(args[0]);
  CUcontext ctx = as_pointer(args[1]);
  unsigned dims[7];
  for (int i = 0; i < 7; ++i) dims[i] = as_unsigned(args[2 + i]);
  CUstream stream = as_pointer(args[9]);
  if (PyErr_Occurred()) return nullptr;
  void* params[1] = {PyBytes_AS_STRING(args[10])};  // the driver copies the block at launch
  CUresult err = launch_in_context(fn, ctx, dims, stream, params);
  return PyLong_FromLong(err);
}

PyObject* tensor_type = nullptr;  // torch.Tensor

// fastcall_torch.cpp's functions (their comments are there); null: torch's Python methods. A
// call reads the pointer once (a Python callback within it may run set_torch), and what it
// pointed to stays: a call in progress may hold it.
struct Torch {
  PyObject* (*fingerprint)(PyObject* tensor);
  int64_t (*view)(PyObject* tensor, void** data, const int64_t** sizes, const int64_t** strides);
  PyObject* (*empty)(PyObject* prototype, const int64_t* sizes, int64_t ndim);
  int (*stream)(int64_t index, int64_t* id);
  int64_t (*signature)(PyObject* tensor);
};
const Torch* lent_torch = nullptr;

// set_torch(fingerprint, view, empty, stream, signature): the addresses of fastcall_torch.cpp's functions;
// set_torch(): none (the Python methods again).
PyObject* set_torch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs == 0) {
    lent_torch = nullptr;
    Py_RETURN_NONE;
  }
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "set_torch expects 5 function addresses, or none");
    return nullptr;
  }
  Torch api{reinterpret_cast<decltype(Torch::fingerprint)>(as_pointer(args[0])),
            reinterpret_cast<decltype(Torch::view)>(as_pointer(args[1])),
            reinterpret_cast<decltype(Torch::empty)>(as_pointer(args[2])),
            reinterpret_cast<decltype(Torch::stream)>(as_pointer(args[3])),
            reinterpret_cast<decltype(Torch::signature)>(as_pointer(args[4]))};
  if (PyErr_Occurred()) return nullptr;
  if (!api.fingerprint || !api.view || !api.empty || !api.stream || !api.signature) {
    PyErr_SetString(PyExc_ValueError, "set_torch: a null function address");
    return nullptr;
  }
  lent_torch = new Torch(api);  // never freed (see above); set once per process
  Py_RETURN_NONE;
}

// set_tensor_type(torch.Tensor)
PyObject* set_tensor_type(PyObject*, PyObject* arg) {
  Py_XSETREF(tensor_type, Py_NewRef(arg));
  Py_RETURN_NONE;
}

// --- plans: a repeated call, prepared once ---------------------------------------------------

// How to fill one field of the argument block (kinds as signature.py's Param roles).
enum FieldKind : int { INPUT_POINTER, OUTPUT_POINTER, BOOL_VALUE, INT_VALUE, FLOAT_VALUE, SHAPE,
                       STRIDES, NDIM };

struct Field {
  int kind, index, offset, capacity;
};

// A plan runs on CUDA (fn: a CUfunction, ctx: its context, launched on torch's current stream)
// or on the CPU (stream None; fn: the library's kk_launch, ctx: its launch description).
struct Plan {
  void* fn;
  void* ctx;
  unsigned dims[7];  // blocks x y z, threads x y z, shared bytes
  std::vector<Field> fields;
  std::vector<char> block;  // the argument block with its constant fields (grid, shared) filled
  std::vector<PyObject*> prototypes;  // empty tensors of each output's dtype and device
  PyObject* shape_type;   // torch.Size
  PyObject* stream;       // stream(index) -> torch's current raw stream
  PyObject* index;        // the device index, a Python int
  long device = 0;        // the same
  // The stream handle of the last stream id fastcall_torch read (see current_stream).
  bool stream_known = false;
  int64_t stream_id = 0;
  void* stream_handle = nullptr;
  PyObject* prepare;      // per output: None, or prepare(tensor) for each new one (fill, poison)
  PyObject* failed;       // failed(CUresult), or on the CPU failed(message bytes): raises
  PyObject* keep;         // what fn and ctx point into (the CPU's launch description)
  Py_ssize_t n_inputs = 0, n_outputs = 0;  // the sequences' least lengths the fields read
  // The words (see Words) of the first call that found this plan by its key, and the objects
  // whose identities are among them, held so that no other object takes their address.
  std::vector<intptr_t> signature;
  std::vector<PyObject*> held;
};

PyObject* str_new_empty = nullptr;
PyObject* str_data_ptr = nullptr;
PyObject* str_stride = nullptr;
PyObject* str_shape = nullptr;
PyObject* str_dim = nullptr;

void destroy(Plan* plan) {
  for (PyObject* p : plan->prototypes) Py_DECREF(p);
  Py_XDECREF(plan->shape_type);
  Py_XDECREF(plan->stream);
  Py_XDECREF(plan->index);
  Py_XDECREF(plan->prepare);
  Py_XDECREF(plan->failed);
  Py_XDECREF(plan->keep);
  for (PyObject* p : plan->held) Py_DECREF(p);
  delete plan;
}

void plan_free(PyObject* capsule) {
  destroy(static_cast<Plan*>(PyCapsule_GetPointer(capsule, "kernelkit.plan")));
}

// make_plan(fn, ctx, dims(7 ints), fields((kind, index, offset, capacity), ...), block(bytes),
//           prototypes(tuple), shape_type, stream, index, prepare(tuple), failed, keep)
//           -> capsule. stream: stream(index) -> torch's current raw stream, or None on the CPU.
PyObject* make_plan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 12 || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != 7 ||
      !PyTuple_Check(args[3]) || !PyBytes_Check(args[4]) || !PyTuple_Check(args[5]) ||
      !PyTuple_Check(args[9]) || PyTuple_GET_SIZE(args[9]) != PyTuple_GET_SIZE(args[5])) {
    PyErr_SetString(PyExc_TypeError, "make_plan: bad arguments");
    return nullptr;
  }
  auto* plan = new Plan();
  plan->fn = as_pointer(args[0]);
  plan->ctx = as_pointer(args[1]);
  for (int i = 0; i < 7; ++i) plan->dims[i] = as_unsigned(PyTuple_GET_ITEM(args[2], i));
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[3]); ++i) {
    Field f{};
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(args[3], i), "iiii", &f.kind, &f.index, &f.offset,
                          &f.capacity)) {
      delete plan;
      return nullptr;
    }
    plan->fields.push_back(f);
  }
  plan->block.assign(PyBytes_AS_STRING(args[4]), PyBytes_AS_STRING(args[4]) + PyBytes_GET_SIZE(args[4]));
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[5]); ++i) {
    PyObject* p = PyTuple_GET_ITEM(args[5], i);
    Py_INCREF(p);
    plan->prototypes.push_back(p);
  }
  plan->keep = Py_NewRef(args[11]);
  PyObject** refs[] = {&plan->shape_type, &plan->stream, &plan->index, &plan->prepare, &plan->failed};
  for (int i = 0; i < 5; ++i) {
    Py_INCREF(args[6 + i]);
    *refs[i] = args[6 + i];
  }
  plan->device = PyLong_AsLong(plan->index);
  for (const Field& f : plan->fields) {  // run() and pack() check their sequences against these
    Py_ssize_t& n = f.kind == OUTPUT_POINTER ? plan->n_outputs : plan->n_inputs;
    n = std::max(n, Py_ssize_t(f.index) + 1);
  }
  if (PyErr_Occurred() || plan->n_outputs > Py_ssize_t(plan->prototypes.size())) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "make_plan: more output fields than prototypes");
    destroy(plan);
    return nullptr;
  }
  PyObject* capsule = PyCapsule_New(plan, "kernelkit.plan", plan_free);
  if (capsule == nullptr) destroy(plan);
  return capsule;
}

// An int attribute or method result of a tensor, as int64; false with an exception set.
bool call_int(PyObject* obj, PyObject* method, long long* out) {
  PyObject* r = PyObject_CallMethodNoArgs(obj, method);
  if (r == nullptr) return false;
  *out = PyLong_AsLongLong(r);
  Py_DECREF(r);
  return !PyErr_Occurred();
}

// shape or stride() of a tensor into `capacity` int32 / int64 slots, zero-padded.
template <class T>
bool store_dims(PyObject* tensor, bool strides, int capacity, char* dst) {
  PyObject* dims = strides ? PyObject_CallMethodNoArgs(tensor, str_stride)
                           : PyObject_GetAttr(tensor, str_shape);
  if (dims == nullptr) return false;
  PyObject* seq = PySequence_Fast(dims, "shape");
  Py_DECREF(dims);
  if (seq == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (int i = 0; i < capacity; ++i) {
    T v = i < n ? static_cast<T>(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i))) : 0;
    std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
  }
  Py_DECREF(seq);
  return !PyErr_Occurred();
}

// The same from dims read in C++.
template <class T>
void copy_dims(const int64_t* dims, int64_t n, int capacity, char* dst) {
  for (int i = 0; i < capacity; ++i) {
    T v = i < n ? static_cast<T>(dims[i]) : 0;
    std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
  }
}

// A tensor field (pointer, shape, strides, ndim) through fastcall_torch.cpp.
bool fill_tensor_field(const Torch* api, const Field& f, PyObject* t, char* dst) {
  void* data;
  const int64_t *sizes, *strides;
  int64_t ndim = api->view(t, &data, &sizes, &strides);
  if (ndim < 0) return false;
  int32_t i = static_cast<int32_t>(ndim);
  switch (f.kind) {
    case INPUT_POINTER:
    case OUTPUT_POINTER: std::memcpy(dst, &data, 8); break;
    case SHAPE: copy_dims<int32_t>(sizes, ndim, f.capacity, dst); break;
    case STRIDES: copy_dims<int64_t>(strides, ndim, f.capacity, dst); break;
    default: std::memcpy(dst, &i, 4);  // NDIM
  }
  return true;
}

bool fill_field(const Torch* api, const Field& f, PyObject* inputs, PyObject* outputs, char* block) {
  char* dst = block + f.offset;
  long long v = 0;
  if (api != nullptr && f.kind != BOOL_VALUE && f.kind != INT_VALUE && f.kind != FLOAT_VALUE) {
    PyObject* t = f.kind == OUTPUT_POINTER ? PyList_GET_ITEM(outputs, f.index)
                                           : PySequence_Fast_GET_ITEM(inputs, f.index);
    return fill_tensor_field(api, f, t, dst);
  }
  switch (f.kind) {
    case INPUT_POINTER:
    case OUTPUT_POINTER: {
      PyObject* t = f.kind == INPUT_POINTER ? PySequence_Fast_GET_ITEM(inputs, f.index)
                                            : PyList_GET_ITEM(outputs, f.index);
      if (!call_int(t, str_data_ptr, &v)) return false;
      std::memcpy(dst, &v, 8);
      return true;
    }
    case BOOL_VALUE: {
      int b = PyObject_IsTrue(PySequence_Fast_GET_ITEM(inputs, f.index));
      if (b < 0) return false;
      *dst = static_cast<char>(b);
      return true;
    }
    case INT_VALUE: {
      long x = PyLong_AsLong(PySequence_Fast_GET_ITEM(inputs, f.index));
      if (PyErr_Occurred()) return false;
      if (x < INT32_MIN || x > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a Python int input does not fit int32");
        return false;
      }
      int32_t i = static_cast<int32_t>(x);
      std::memcpy(dst, &i, 4);
      return true;
    }
    case FLOAT_VALUE: {
      float x = static_cast<float>(PyFloat_AsDouble(PySequence_Fast_GET_ITEM(inputs, f.index)));
      if (PyErr_Occurred()) return false;
      std::memcpy(dst, &x, 4);
      return true;
    }
    case SHAPE:
      return store_dims<int32_t>(PySequence_Fast_GET_ITEM(inputs, f.index), false, f.capacity, dst);
    case STRIDES:
      return store_dims<int64_t>(PySequence_Fast_GET_ITEM(inputs, f.index), true, f.capacity, dst);
    case NDIM: {
      if (!call_int(PySequence_Fast_GET_ITEM(inputs, f.index), str_dim, &v)) return false;
      int32_t i = static_cast<int32_t>(v);
      std::memcpy(dst, &i, 4);
      return true;
    }
  }
  PyErr_SetString(PyExc_SystemError, "kernelkit plan: unknown field kind");
  return false;
}

// The plan's argument block filled from these inputs (a fast sequence) and outputs (a list),
// into `block` (plan->block.size() bytes).
bool pack_block(const Torch* api, const Plan* plan, PyObject* inputs, PyObject* outputs, char* block) {
  if (PySequence_Fast_GET_SIZE(inputs) < plan->n_inputs || PyList_GET_SIZE(outputs) < plan->n_outputs) {
    PyErr_SetString(PyExc_ValueError, "kernelkit plan: fewer inputs or outputs than the kernel's");
    return false;
  }
  std::memcpy(block, plan->block.data(), plan->block.size());
  for (const Field& f : plan->fields)
    if (!fill_field(api, f, inputs, outputs, block)) return false;
  return true;
}

// pack(plan, inputs, outputs) -> the argument block run() would launch with (for tests).
PyObject* pack(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyList_CheckExact(args[2])) {
    PyErr_SetString(PyExc_TypeError, "pack expects (plan, inputs, outputs: list)");
    return nullptr;
  }
  auto* plan = static_cast<Plan*>(PyCapsule_GetPointer(args[0], "kernelkit.plan"));
  if (plan == nullptr) return nullptr;
  PyObject* inputs = PySequence_Fast(args[1], "inputs");
  if (inputs == nullptr) return nullptr;
  std::vector<char> block(plan->block.size());
  bool ok = pack_block(lent_torch, plan, inputs, args[2], block.data());
  Py_DECREF(inputs);
  return ok ? PyBytes_FromStringAndSize(block.data(), static_cast<Py_ssize_t>(block.size())) : nullptr;
}

PyObject* run_plan(Plan* plan, PyObject* inputs, PyObject* shapes);

// run(plan, inputs, output_shapes) -> the outputs (a list), or None where the shapes need the
// general path (see read_shape), or every output is empty (no kernel runs).
PyObject* run(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "run expects (plan, inputs, output_shapes)");
    return nullptr;
  }
  auto* plan = static_cast<Plan*>(PyCapsule_GetPointer(args[0], "kernelkit.plan"));
  return plan ? run_plan(plan, args[1], args[2]) : nullptr;
}

// An output shape's dims: in place up to 8 (a heap allocation costs a call ~50 ns).
struct Dims {
  int64_t local[8];
  std::vector<int64_t> heap;
  int64_t* data = local;
  Py_ssize_t size = 0;
  void resize(Py_ssize_t n) {
    size = n;
    if (n > 8) heap.resize(n);
    data = n > 8 ? heap.data() : local;
  }
  bool has_zero() const { return std::find(data, data + size, 0) != data + size; }
};

// An output shape's dims, where it is a tuple or torch.Size of non-negative Python ints; false,
// with no error set, for anything else: the general path converts it (NumPy integers) or says
// what is wrong.
bool read_shape(const Plan* plan, PyObject* shape, Dims& dims) {
  if (!PyTuple_CheckExact(shape) && Py_TYPE(shape) != reinterpret_cast<PyTypeObject*>(plan->shape_type))
    return false;
  Py_ssize_t n = PyTuple_GET_SIZE(shape);  // torch.Size is a tuple
  dims.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* d = PyTuple_GET_ITEM(shape, i);
    int overflow = 0;
    dims.data[i] = PyLong_CheckExact(d) ? PyLong_AsLongLongAndOverflow(d, &overflow) : -1;
    if (overflow || dims.data[i] < 0) {
      PyErr_Clear();
      return false;
    }
  }
  return true;
}

// failed(why) of a plan whose launch failed (why: a new reference, or null with an error set);
// false when it raised, as it does.
bool told_failed(Plan* plan, PyObject* why) {
  PyObject* r = why ? PyObject_CallOneArg(plan->failed, why) : nullptr;
  Py_XDECREF(why);
  Py_XDECREF(r);
  return r != nullptr;
}

// A new output's fill by the driver's memset on the stream: `fill` is (unit, pattern, units an
// element), the output packed (it is new) with `dims`. A driver error goes where a launch's does.
bool memset_output(const Torch* api, Plan* plan, PyObject* out, PyObject* fill, const Dims& dims, void* stream) {
  size_t count = static_cast<size_t>(PyLong_AsLong(PyTuple_GET_ITEM(fill, 2)));
  for (Py_ssize_t d = 0; d < dims.size; ++d) count *= static_cast<size_t>(dims.data[d]);
  const int unit = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(fill, 0)));
  const unsigned pattern = static_cast<unsigned>(PyLong_AsUnsignedLong(PyTuple_GET_ITEM(fill, 1)));
  if (PyErr_Occurred()) return false;
  if (count == 0) return true;
  void* data;
  if (api != nullptr) {
    const int64_t *sizes, *strides;
    if (api->view(out, &data, &sizes, &strides) < 0) return false;
  } else {
    long long v;
    if (!call_int(out, str_data_ptr, &v)) return false;
    data = reinterpret_cast<void*>(v);
  }
  CUresult err = memset_in_context(plan->ctx, data, unit, pattern, count, stream);
  return err == 0 || told_failed(plan, PyLong_FromLong(err));
}

// torch's current stream on the plan's device. fastcall_torch reads its id in C++ (~0.2 us less
// than the Python call), and the handle of the id the plan saw last is kept: an id's handle
// never changes (torch makes its stream pools once; an external stream's id is its handle). The
// Python call where the id is another, or without fastcall_torch.
bool current_stream(const Torch* api, Plan* plan, void** stream) {
  int64_t id = 0;
  bool read = api != nullptr && api->stream(plan->device, &id) == 0;
  if (!read) PyErr_Clear();  // fastcall_torch could not say: the Python call says why
  if (read && plan->stream_known && id == plan->stream_id) {
    *stream = plan->stream_handle;
    return true;
  }
  PyObject* handle = PyObject_CallOneArg(plan->stream, plan->index);
  if (handle == nullptr) return false;
  *stream = PyLong_AsVoidPtr(handle);
  Py_DECREF(handle);
  if (PyErr_Occurred()) return false;
  if (read) {
    plan->stream_known = true;
    plan->stream_id = id;
    plan->stream_handle = *stream;
  }
  return true;
}

// A CPU plan's launch: the library's kk_launch, without the GIL as ctypes calls it; its failure
// (a fault, a barrier that cannot complete) to failed(message), which raises.
bool launch_on_cpu(Plan* plan, const char* block) {
  char message[2048] = "";  // (the CPU backend's _ERROR_CAPACITY; the runtime ends it with a NUL)
  int err;
  Py_BEGIN_ALLOW_THREADS
  err = reinterpret_cast<CpuLaunch>(plan->fn)(block, plan->ctx, message, sizeof message);
  Py_END_ALLOW_THREADS
  return err == 0 || told_failed(plan, PyBytes_FromString(message));
}

PyObject* run_plan(Plan* plan, PyObject* inputs_arg, PyObject* shapes) {
  const bool cpu = plan->stream == Py_None;
  if (!cpu && launch_kernel == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "kernelkit's CUDA launcher has no driver entry points");
    return nullptr;
  }
  const Torch* api = lent_torch;
  Py_ssize_t n = static_cast<Py_ssize_t>(plan->prototypes.size());
  if (!(PyList_CheckExact(shapes) || PyTuple_CheckExact(shapes)) || PySequence_Fast_GET_SIZE(shapes) != n)
    Py_RETURN_NONE;
  Dims dims;
  bool all_empty = n > 0;  // then the general path makes the outputs and runs no kernel
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!read_shape(plan, PySequence_Fast_GET_ITEM(shapes, i), dims)) Py_RETURN_NONE;
    all_empty = all_empty && dims.has_zero();
  }
  if (all_empty) Py_RETURN_NONE;
  void* stream = nullptr;
  if (!cpu && !current_stream(api, plan, &stream)) return nullptr;
  PyObject* inputs = PySequence_Fast(inputs_arg, "inputs");
  if (inputs == nullptr) return nullptr;
  PyObject* outputs = PyList_New(n);
  if (outputs == nullptr) {
    Py_DECREF(inputs);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* shape = PySequence_Fast_GET_ITEM(shapes, i);
    read_shape(plan, shape, dims);  // true: checked above
    PyObject* out = api ? api->empty(plan->prototypes[i], dims.data, static_cast<int64_t>(dims.size))
                        : PyObject_CallMethodOneArg(plan->prototypes[i], str_new_empty, shape);
    if (out == nullptr) goto fail;
    PyList_SET_ITEM(outputs, i, out);
  }
  {
    // The block on the stack where it fits (the usual), on the heap else (up to 32 KB on sm_90).
    alignas(16) char local[1024];
    std::vector<char> heap(plan->block.size() > sizeof local ? plan->block.size() : 0);
    char* block = heap.empty() ? local : heap.data();
    if (!pack_block(api, plan, inputs, outputs, block)) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) goto fail;
      PyErr_Clear();  // a Python int beyond int32: the general path says so
      Py_DECREF(outputs);
      Py_DECREF(inputs);
      Py_RETURN_NONE;
    }
    // Outputs are filled once the inputs are packed: an input that cannot be (a torch.func
    // tensor, which has no storage) fails with its own error, not a fill's.
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* out = PyList_GET_ITEM(outputs, i);
      PyObject* prepare = PyTuple_GET_ITEM(plan->prepare, i);
      if (PyTuple_CheckExact(prepare)) {
        read_shape(plan, PySequence_Fast_GET_ITEM(shapes, i), dims);
        if (!memset_output(api, plan, out, prepare, dims, stream)) goto fail;
      } else if (prepare != Py_None) {
        PyObject* r = PyObject_CallOneArg(prepare, out);
        if (r == nullptr) goto fail;
        Py_DECREF(r);
      }
    }
    if (cpu) {
      if (!launch_on_cpu(plan, block)) goto fail;
    } else {
      void* params[1] = {block};
      CUresult err = launch_in_context(plan->fn, plan->ctx, plan->dims, stream, params);
      if (err != 0 && !told_failed(plan, PyLong_FromLong(err))) goto fail;
    }
  }
  Py_DECREF(inputs);
  return outputs;
fail:
  Py_DECREF(outputs);
  Py_DECREF(inputs);
  return nullptr;
}

// --- the plan key, as kernel._plan_key computes it -------------------------------------------

PyObject* str_dtype = nullptr;
PyObject* str_device = nullptr;
PyObject* str_is_contiguous = nullptr;
PyObject* str_requires_grad = nullptr;

// (dtype, device, dim(), is_contiguous(), requires_grad) of a tensor; the type of anything else.
PyObject* fingerprint(const Torch* api, PyObject* x) {
  if (Py_TYPE(x) != reinterpret_cast<PyTypeObject*>(tensor_type))
    return Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(x)));
  if (api != nullptr) return api->fingerprint(x);
  PyObject* fp = PyTuple_New(5);
  if (fp == nullptr) return nullptr;
  PyObject* items[5] = {PyObject_GetAttr(x, str_dtype), PyObject_GetAttr(x, str_device),
                        PyObject_CallMethodNoArgs(x, str_dim),
                        PyObject_CallMethodNoArgs(x, str_is_contiguous),
                        PyObject_GetAttr(x, str_requires_grad)};
  for (int i = 0; i < 5; ++i) {
    if (items[i] == nullptr) {
      for (int j = i + 1; j < 5; ++j) Py_XDECREF(items[j]);
      Py_DECREF(fp);
      return nullptr;
    }
    PyTuple_SET_ITEM(fp, i, items[i]);
  }
  return fp;
}

// Template pairs as (name, value, type(name), type(value)); nullptr with no error set: no key.
PyObject* template_key(PyObject* t) {
  if (t == Py_None) return Py_NewRef(t);
  if (!PyList_CheckExact(t) && !PyTuple_CheckExact(t)) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(t);
  PyObject* key = PyTuple_New(n);
  if (key == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* pair = PySequence_Fast(PySequence_Fast_GET_ITEM(t, i), "template");
    if (pair == nullptr) {
      PyErr_Clear();
      Py_DECREF(key);
      return nullptr;
    }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(pair);
    PyObject* item = PyTuple_New(2 * m);
    if (item == nullptr) {
      Py_DECREF(pair);
      Py_DECREF(key);
      return nullptr;
    }
    for (Py_ssize_t j = 0; j < m; ++j) {
      PyObject* v = PySequence_Fast_GET_ITEM(pair, j);
      PyTuple_SET_ITEM(item, j, Py_NewRef(v));
      PyTuple_SET_ITEM(item, m + j, Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(v))));
    }
    Py_DECREF(pair);
    PyTuple_SET_ITEM(key, i, item);
  }
  return key;
}

// grid / threadgroup in a key: the tuple itself when it holds exact ints (the usual case), else
// (dims, type of each item) for a tuple and (dims,) for anything else, so that (8.0, 1, 1) never
// finds the plan of (8, 1, 1): they compare and hash equal.
PyObject* dims_key(PyObject* d) {
  if (!PyTuple_CheckExact(d)) return PyTuple_Pack(1, d);
  Py_ssize_t n = PyTuple_GET_SIZE(d);
  bool ints = true;
  for (Py_ssize_t i = 0; i < n && ints; ++i) ints = PyLong_CheckExact(PyTuple_GET_ITEM(d, i));
  if (ints) return Py_NewRef(d);
  PyObject* key = PyTuple_New(1 + n);
  if (key == nullptr) return nullptr;
  PyTuple_SET_ITEM(key, 0, Py_NewRef(d));
  for (Py_ssize_t i = 0; i < n; ++i)
    PyTuple_SET_ITEM(key, 1 + i, Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(PyTuple_GET_ITEM(d, i)))));
  return key;
}

// The key of kernel._plan_key(inputs, output_dtypes, grid, threadgroup, template); nullptr with
// no error set where the arguments give none (the general path then checks them).
PyObject* plan_key(PyObject* inputs, PyObject* dtypes, PyObject* grid, PyObject* group,
                   PyObject* templ) {
  if (!(PyList_CheckExact(inputs) || PyTuple_CheckExact(inputs)) ||
      !(PyList_CheckExact(dtypes) || PyTuple_CheckExact(dtypes)))
    return nullptr;
  PyObject* tkey = template_key(templ);
  if (tkey == nullptr) return nullptr;
  const Torch* api = lent_torch;
  Py_ssize_t n_in = PySequence_Fast_GET_SIZE(inputs), n_out = PySequence_Fast_GET_SIZE(dtypes);
  PyObject* key = PyTuple_New(4 + n_in + n_out);
  PyObject* count = PyLong_FromSsize_t(n_in);
  if (key == nullptr || count == nullptr) {
    Py_XDECREF(key);
    Py_XDECREF(count);
    Py_DECREF(tkey);
    return nullptr;
  }
  PyTuple_SET_ITEM(key, 2, tkey);
  PyTuple_SET_ITEM(key, 3, count);
  PyObject* gkey = dims_key(grid);
  PyObject* tgkey = gkey ? dims_key(group) : nullptr;
  if (tgkey == nullptr) {
    Py_XDECREF(gkey);
    Py_DECREF(key);
    return nullptr;
  }
  PyTuple_SET_ITEM(key, 0, gkey);
  PyTuple_SET_ITEM(key, 1, tgkey);
  for (Py_ssize_t i = 0; i < n_in; ++i) {
    PyObject* fp = fingerprint(api, PySequence_Fast_GET_ITEM(inputs, i));
    if (fp == nullptr) {
      Py_DECREF(key);
      return nullptr;
    }
    PyTuple_SET_ITEM(key, 4 + i, fp);
  }
  for (Py_ssize_t i = 0; i < n_out; ++i)
    PyTuple_SET_ITEM(key, 4 + n_in + i, Py_NewRef(PySequence_Fast_GET_ITEM(dtypes, i)));
  return key;
}

// key(inputs, output_dtypes, grid, threadgroup, template) -> the plan key or None (for tests).
PyObject* key(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "key expects 5 arguments");
    return nullptr;
  }
  PyObject* k = plan_key(args[0], args[1], args[2], args[3], args[4]);
  if (k == nullptr && PyErr_Occurred()) return nullptr;
  return k ? k : Py_NewRef(Py_None);
}

// The outputs of the plan in `plans` (a dict) for a call's arguments where it has one and it
// ran (a list); else the key to store the general path's plan under, or None where the
// arguments give no key.
PyObject* call_plan(PyObject* plans, PyObject* inputs, PyObject* shapes, PyObject* dtypes,
                    PyObject* grid, PyObject* group, PyObject* templ, PyObject** found = nullptr) {
  PyObject* k = plan_key(inputs, dtypes, grid, group, templ);
  if (k == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  PyObject* plan = PyDict_GetItemWithError(plans, k);  // borrowed
  if (plan == nullptr) {
    if (!PyErr_Occurred()) return k;
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
      Py_DECREF(k);
      return nullptr;
    }
    PyErr_Clear();  // unhashable (a list grid): no key
    Py_DECREF(k);
    Py_RETURN_NONE;
  }
  Py_INCREF(plan);
  if (found != nullptr) *found = Py_NewRef(plan);  // the dict may drop it meanwhile
  PyObject* out;
  if (PyCapsule_CheckExact(plan)) {
    auto* p = static_cast<Plan*>(PyCapsule_GetPointer(plan, "kernelkit.plan"));
    out = p ? run_plan(p, inputs, shapes) : nullptr;
  } else {
    out = PyObject_CallFunctionObjArgs(plan, inputs, shapes, nullptr);
  }
  Py_DECREF(plan);
  if (out == Py_None) {
    Py_DECREF(out);
    return k;
  }
  Py_DECREF(k);
  return out;
}

// call(plans, inputs, output_shapes, output_dtypes, grid, threadgroup, template): call_plan.
PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7 || !PyDict_CheckExact(args[0])) {
    PyErr_SetString(PyExc_TypeError, "call expects (plans: dict, inputs, output_shapes, "
                                     "output_dtypes, grid, threadgroup, template)");
    return nullptr;
  }
  return call_plan(args[0], args[1], args[2], args[3], args[4], args[5], args[6]);
}

// --- Kernel.__call__'s fast path in C ---------------------------------------------------------
//
// CPython calls an instance of a Python class through its type's tp_call, slot_tp_call: the
// keywords made into a dict, the dict unpacked again for __call__, its frame and keyword binding,
// torch.compiler.is_compiling(), then fastcall's call: ~0.6 us of a repeated call's host time on
// an H100 host. set_call puts kernel_call in Kernel's tp_call: a plain call (no stream, verbose,
// init_value...) whose plan there is runs here, and every other call goes on to the Python
// __call__, as before. Dynamo reads the class's __call__ (the Python function), never tp_call,
// so it traces what it traced. Subclasses of Kernel keep slot_tp_call (theirs is their own).

PyTypeObject* kernel_type = nullptr;   // Kernel while kernel_call is its tp_call
ternaryfunc python_tp_call = nullptr;  // Kernel's own tp_call (slot_tp_call), put back by set_call()
PyObject* python_call = nullptr;       // Kernel.__call__, the Python function
PyObject* compiler = nullptr;          // torch.compiler

PyObject *str_inputs, *str_output_shapes, *str_output_dtypes, *str_grid, *str_threadgroup,
    *str_template, *str_init_value, *str_verbose, *str_stream, *str_ensure_row_contiguous,
    *str_check_bounds, *str_timeout, *str_plans, *str_last_plan, *str_compiling;

// A plain call's key arguments as words, compared with those of the call that last ran a plan
// (its kernel's _last_plan) in place of the key (~0.3 us: a tuple of tuples made and hashed, on
// an H100 host): grid and threadgroup, tuples of Python ints, by value; each input's
// fingerprint (fastcall_torch's, for a torch.Tensor) or type; the output dtypes and the
// template's items by identity, as identical objects are equal. Each count comes before what it
// counts, and a tensor's word after a 0 (a type's address is never 0), so equal words are equal
// keys. Other arguments (a list grid...) have no words: the key's way.
struct Words {
  static constexpr int N = 64;
  intptr_t word[N];
  PyObject* object[N];  // those whose identity is a word (borrowed)
  int n = 0, n_objects = 0;
  bool put(intptr_t w) {
    if (n == N) return false;
    word[n++] = w;
    return true;
  }
  bool put_object(PyObject* o) {
    if (n_objects == N || !put(reinterpret_cast<intptr_t>(o))) return false;
    object[n_objects++] = o;
    return true;
  }
  bool put_dims(PyObject* d) {
    if (!PyTuple_CheckExact(d) || !put(PyTuple_GET_SIZE(d))) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(d); ++i) {
      PyObject* v = PyTuple_GET_ITEM(d, i);
      int overflow = 0;
      if (!PyLong_CheckExact(v)) return false;
      long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
      if (overflow || (x == -1 && PyErr_Occurred()) || !put(static_cast<intptr_t>(x))) {
        PyErr_Clear();
        return false;
      }
    }
    return true;
  }
  bool read(const Torch* api, PyObject* inputs, PyObject* dtypes, PyObject* grid, PyObject* group,
            PyObject* templ) {
    if (!(PyList_CheckExact(inputs) || PyTuple_CheckExact(inputs)) ||
        !(PyList_CheckExact(dtypes) || PyTuple_CheckExact(dtypes)) || !put_dims(grid) || !put_dims(group))
      return false;
    if (templ == Py_None) {
      if (!put(-1)) return false;
    } else {
      if (!(PyList_CheckExact(templ) || PyTuple_CheckExact(templ)) || !put(PySequence_Fast_GET_SIZE(templ)))
        return false;
      for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(templ); ++i) {
        PyObject* pair = PySequence_Fast_GET_ITEM(templ, i);
        if (!(PyList_CheckExact(pair) || PyTuple_CheckExact(pair)) || !put(PySequence_Fast_GET_SIZE(pair)))
          return false;
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(pair); ++j)
          if (!put_object(PySequence_Fast_GET_ITEM(pair, j))) return false;
      }
    }
    if (!put(PySequence_Fast_GET_SIZE(inputs))) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(inputs); ++i) {
      PyObject* x = PySequence_Fast_GET_ITEM(inputs, i);
      bool ok = Py_TYPE(x) == reinterpret_cast<PyTypeObject*>(tensor_type)
                    ? put(0) && put(static_cast<intptr_t>(api->signature(x)))
                    : put_object(reinterpret_cast<PyObject*>(Py_TYPE(x)));
      if (!ok) return false;
    }
    if (!put(PySequence_Fast_GET_SIZE(dtypes))) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(dtypes); ++i)
      if (!put_object(PySequence_Fast_GET_ITEM(dtypes, i))) return false;
    return true;
  }
  bool signs(const Plan* plan) const {
    return plan->signature.size() == size_t(n) &&
           std::memcmp(plan->signature.data(), word, n * sizeof(intptr_t)) == 0;
  }
};

// The outputs of a plain call that has a plan (a list); nullptr, with no error set, where the
// Python __call__ takes it.
PyObject* plain_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) != 0 || kwargs == nullptr) return nullptr;
  // torch.compiler.is_compiling() is this flag (Dynamo folds the call; non-strict export sets it)
  PyObject* compiling = PyObject_GetAttr(compiler, str_compiling);
  Py_XDECREF(compiling);
  if (compiling != Py_False) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject *inputs = nullptr, *shapes = nullptr, *dtypes = nullptr, *grid = nullptr, *group = nullptr;
  PyObject *templ = Py_None, *name, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(kwargs, &pos, &name, &value)) {  // names are interned where code spells them
    if (name == str_inputs) inputs = value;
    else if (name == str_output_shapes) shapes = value;
    else if (name == str_output_dtypes) dtypes = value;
    else if (name == str_grid) grid = value;
    else if (name == str_threadgroup) group = value;
    else if (name == str_template) templ = value;
    else if (!(value == Py_None && (name == str_init_value || name == str_stream ||
                                    name == str_ensure_row_contiguous || name == str_check_bounds ||
                                    name == str_timeout || name == str_verbose)) &&
             !(value == Py_False && name == str_verbose))
      return nullptr;  // an init_value, a stream..., or a name to say is wrong
  }
  if (!inputs || !shapes || !dtypes || !grid || !group) return nullptr;
  const Torch* api = lent_torch;
  Words words;
  bool signed_call = api != nullptr && words.read(api, inputs, dtypes, grid, group, templ);
  if (signed_call) {  // the plan the last call ran, where this call has its words
    PyObject* last = PyObject_GetAttr(self, str_last_plan);
    auto* plan = last && PyCapsule_CheckExact(last)
                     ? static_cast<Plan*>(PyCapsule_GetPointer(last, "kernelkit.plan")) : nullptr;
    PyObject* out = plan && words.signs(plan) ? run_plan(plan, inputs, shapes) : nullptr;
    Py_XDECREF(last);
    if (out != nullptr || PyErr_Occurred()) {
      if (out != Py_None) return out;
      Py_DECREF(out);
      return nullptr;
    }
  }
  PyObject* plans = PyObject_GetAttr(self, str_plans);
  if (plans == nullptr || !PyDict_CheckExact(plans)) {
    Py_XDECREF(plans);
    PyErr_Clear();
    return nullptr;
  }
  PyObject* found = nullptr;
  PyObject* out = call_plan(plans, inputs, shapes, dtypes, grid, group, templ, &found);
  if (out != nullptr && PyList_CheckExact(out) && signed_call && found && PyCapsule_CheckExact(found)) {
    auto* plan = static_cast<Plan*>(PyCapsule_GetPointer(found, "kernelkit.plan"));
    if (plan->signature.empty()) {  // the words of this plan's key: the first call's
      plan->signature.assign(words.word, words.word + words.n);
      for (int i = 0; i < words.n_objects; ++i) plan->held.push_back(Py_NewRef(words.object[i]));
    }
    if (words.signs(plan) && PyObject_SetAttr(self, str_last_plan, found) < 0) Py_CLEAR(out);
  }
  Py_XDECREF(found);
  Py_DECREF(plans);
  if (out == nullptr || PyList_CheckExact(out)) return out;
  Py_DECREF(out);  // a key: the general path makes the plan (its Python __call__ finds the key)
  return nullptr;
}

PyObject* kernel_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject* out = plain_call(self, args, kwargs);
  if (out != nullptr || PyErr_Occurred()) return out;
  Py_ssize_t n = PyTuple_GET_SIZE(args);  // Kernel.__call__(self, *args, **kwargs)
  std::vector<PyObject*> stack(n + 1);
  stack[0] = self;
  for (Py_ssize_t i = 0; i < n; ++i) stack[i + 1] = PyTuple_GET_ITEM(args, i);
  return PyObject_VectorcallDict(python_call, stack.data(), static_cast<size_t>(n + 1), kwargs);
}

// set_call(Kernel, Kernel.__call__, torch.compiler): kernel_call becomes Kernel's tp_call;
// set_call(): Kernel's own again (for tests).
PyObject* set_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs == 0) {
    if (kernel_type != nullptr && kernel_type->tp_call == kernel_call) kernel_type->tp_call = python_tp_call;
    Py_RETURN_NONE;
  }
  if (nargs != 3 || !PyType_Check(args[0]) || !PyFunction_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "set_call expects (Kernel, Kernel.__call__, torch.compiler), or nothing");
    return nullptr;
  }
  auto* type = reinterpret_cast<PyTypeObject*>(args[0]);
  if (kernel_type != nullptr && kernel_type != type) {
    PyErr_SetString(PyExc_ValueError, "set_call: another Kernel class");
    return nullptr;
  }
  if (type->tp_call != kernel_call) {
    python_tp_call = type->tp_call;
    Py_XSETREF(kernel_type, reinterpret_cast<PyTypeObject*>(Py_NewRef(args[0])));
    Py_XSETREF(python_call, Py_NewRef(args[1]));
    Py_XSETREF(compiler, Py_NewRef(args[2]));
    type->tp_call = kernel_call;
  }
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"set_tensor_type", set_tensor_type, METH_O, "Set torch.Tensor (inputs of exactly this type are keyed)."},
    {"key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(key)), METH_FASTCALL,
     "The plan key of a call's arguments, or None."},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call)), METH_FASTCALL,
     "Run the plan of a repeated call; else return its key (or None)."},
    {"set_driver", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_driver)),
     METH_FASTCALL, "Set the driver entry points (addresses from cuGetProcAddress)."},
    {"set_torch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_torch)),
     METH_FASTCALL, "Lend fastcall_torch.cpp's functions (their addresses), or none."},
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(launch)), METH_FASTCALL,
     "Launch a kernel with its packed argument block; returns the CUresult."},
    {"make_plan", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(make_plan)),
     METH_FASTCALL, "Prepare a repeated call (see run)."},
    {"pack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pack)), METH_FASTCALL,
     "The argument block a prepared call would launch with."},
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)), METH_FASTCALL,
     "Allocate the outputs, pack and launch a prepared call; None: take the general path."},
    {"set_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_call)), METH_FASTCALL,
     "Run Kernel's plain calls in C (its tp_call), or no longer."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcall", nullptr, -1, methods};

}  // namespace

extern "C" PyMODINIT_FUNC PyInit__fastcall() {
  str_dtype = PyUnicode_InternFromString("dtype");
  str_device = PyUnicode_InternFromString("device");
  str_is_contiguous = PyUnicode_InternFromString("is_contiguous");
  str_requires_grad = PyUnicode_InternFromString("requires_grad");
  str_new_empty = PyUnicode_InternFromString("new_empty");
  str_data_ptr = PyUnicode_InternFromString("data_ptr");
  str_stride = PyUnicode_InternFromString("stride");
  str_shape = PyUnicode_InternFromString("shape");
  str_dim = PyUnicode_InternFromString("dim");
  PyObject** names[] = {&str_inputs, &str_output_shapes, &str_output_dtypes, &str_grid,
                        &str_threadgroup, &str_template, &str_init_value, &str_verbose, &str_stream,
                        &str_ensure_row_contiguous, &str_check_bounds, &str_timeout, &str_plans,
                        &str_last_plan, &str_compiling};
  const char* spelled[] = {"inputs", "output_shapes", "output_dtypes", "grid", "threadgroup",
                           "template", "init_value", "verbose", "stream", "ensure_row_contiguous",
                           "check_bounds", "timeout", "_plans", "_last_plan", "_is_compiling_flag"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) *names[i] = PyUnicode_InternFromString(spelled[i]);
  return PyModule_Create(&module);
}
