// custom_function's autograd node in C++: what torch.autograd.Function.apply and its Python node
// do for a call, less their Python.
//
// A custom_function call that plain autograd records (no torch.func transform, no forward AD)
// runs its forward below autograd, then `attach` makes this node for it: gradient edges to the
// call's tensors, the outputs' history, the tensors and outputs saved (SavedVariable: version
// checks, saved-tensor hooks, "backward through the graph a second time"). Its apply calls the
// Python backward (autodiff._node_backward) with the call, the saved tensors and the cotangents.
// What a Python autograd.Function adds (its ctx object, saved_tensors, the backward's Python
// frames) was ~15% of a null Function's forward + backward host time on the CPU; here it is C++.
//
// Built into the library of fastcall_torch.cpp (against the installed torch, whose C++ ABI and
// autograd internals change with each release): torch 2.11 holds nodes in std::shared_ptr,
// later ones in c10::intrusive_ptr, and both are served here.

#include <Python.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define KK_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;
using NodePtr = decltype(std::declval<Node&>().getptr());

// A new node, held as this torch holds nodes. (deleteNode, torch 2.11's deleter that frees a deep
// graph without recursing, is found by argument-dependent lookup: later torches have none.)
template <class T, class... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_same_v<decltype(std::declval<T&>().getptr()), std::shared_ptr<Node>>) {
    return std::shared_ptr<Node>(new T(std::forward<Args>(args)...), [](T* n) { deleteNode(n); });
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

struct Gil {
  PyGILState_STATE state = PyGILState_Ensure();
  ~Gil() { PyGILState_Release(state); }
};

struct CustomFunctionBackward : Node {
  PyObject* backward;  // autodiff._node_backward
  PyObject* call;      // the call's record (autodiff._Call): its rules and structure, no tensors
  std::string name_;
  std::vector<SavedVariable> saved;  // the call's tensors, then its outputs

  CustomFunctionBackward(torch::autograd::edge_list&& edges, PyObject* backward, PyObject* call, std::string name)
      : Node(std::move(edges)), backward(Py_NewRef(backward)), call(Py_NewRef(call)), name_(std::move(name)) {}

  ~CustomFunctionBackward() override {
    if (Py_IsInitialized()) {  // (a graph may be freed on autograd's threads, without the GIL)
      Gil gil;
      Py_DECREF(backward);
      Py_DECREF(call);
    }
  }

  std::string name() const override { return name_; }

  // Compiled autograd traces Python nodes only: calls recorded while it is on take
  // torch.autograd.Function (autodiff._record), and a graph recorded before it was turned on says so.
  void compiled_args(torch::autograd::CompiledNodeArgs&) const override {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "[custom_function] ", name_, " was recorded before compiled autograd was "
                                "turned on, and compiled autograd cannot trace it: turn compiled autograd on "
                                "before the forward (torch._dynamo.config.compiled_autograd = True, or its "
                                "context around the whole step)");
  }

  void release_variables() override {
    for (SavedVariable& s : saved) s.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    // Unpacked before any Python object is made: a tensor modified in place since, or a graph
    // already run through (released), raises torch's own error here.
    auto self = getptr();
    std::vector<at::Tensor> tensors;
    tensors.reserve(saved.size() + grads.size());
    for (const SavedVariable& s : saved) tensors.push_back(s.unpack(self));
    for (at::Tensor& g : grads) tensors.push_back(std::move(g));
    const size_t expected = num_outputs();

    Gil gil;
    PyObject* args = PyTuple_New(static_cast<Py_ssize_t>(tensors.size() + 1));
    if (args == nullptr) throw_python();
    PyTuple_SET_ITEM(args, 0, Py_NewRef(call));
    for (size_t i = 0; i < tensors.size(); ++i) {
      PyObject* o = tensors[i].defined() ? THPVariable_Wrap(std::move(tensors[i])) : Py_NewRef(Py_None);
      if (o == nullptr) {
        Py_DECREF(args);
        throw_python();
      }
      PyTuple_SET_ITEM(args, static_cast<Py_ssize_t>(i + 1), o);
    }
    PyObject* result = PyObject_Call(backward, args, nullptr);
    Py_DECREF(args);
    if (result == nullptr) throw_python();
    variable_list out;
    const bool sequence = PyTuple_Check(result) || PyList_Check(result);
    const Py_ssize_t n = sequence ? PySequence_Fast_GET_SIZE(result) : -1;
    if (n != static_cast<Py_ssize_t>(expected)) {
      Py_DECREF(result);
      PyErr_Format(PyExc_RuntimeError, "[custom_function] %s returned %zd gradients for %zu inputs",
                   name_.c_str(), n, expected);
      throw_python();
    }
    out.reserve(expected);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* g = PySequence_Fast_GET_ITEM(result, i);
      if (g == Py_None) {
        out.emplace_back();
      } else if (THPVariable_Check(g)) {
        out.push_back(THPVariable_Unpack(g));
      } else {
        PyErr_Format(PyExc_TypeError, "[custom_function] %s returned a %s as gradient %zd; expected a "
                     "tensor or None", name_.c_str(), Py_TYPE(g)->tp_name, i);
        Py_DECREF(result);
        throw_python();
      }
    }
    Py_DECREF(result);
    return out;
  }

  [[noreturn]] static void throw_python() {
    python_error error;
    error.persist();
    throw error;
  }
};

bool differentiable(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type());
}

// attach(backward, call, inputs, outputs, name) -> bool: the node of a call whose forward ran
// below autograd, over `inputs` (its tensors) and `outputs` (fresh tensors of its forward). False
// (nothing done) where an output is not one this node can own: an input or a view (torch's
// Function gives those a view of their own), one already recorded, or one returned twice; the
// caller then goes through torch.autograd.Function.
PyObject* attach(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 5 || !PyList_Check(args[2]) || !PyList_Check(args[3]) || !PyUnicode_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "attach(backward, call, inputs: list, outputs: list, name: str)");
    return nullptr;
  }
  PyObject* inputs = args[2];
  PyObject* outputs = args[3];
  const Py_ssize_t n_in = PyList_GET_SIZE(inputs), n_out = PyList_GET_SIZE(outputs);
  variable_list ins, outs;
  ins.reserve(n_in);
  outs.reserve(n_out);
  for (Py_ssize_t i = 0; i < n_in; ++i) {
    PyObject* o = PyList_GET_ITEM(inputs, i);
    if (!THPVariable_Check(o)) {
      PyErr_Format(PyExc_TypeError, "attach: input %zd is a %s", i, Py_TYPE(o)->tp_name);
      return nullptr;
    }
    ins.push_back(THPVariable_Unpack(o));
  }
  for (Py_ssize_t i = 0; i < n_out; ++i) {
    PyObject* o = PyList_GET_ITEM(outputs, i);
    if (!THPVariable_Check(o)) {
      PyErr_Format(PyExc_TypeError, "attach: output %zd is a %s", i, Py_TYPE(o)->tp_name);
      return nullptr;
    }
    const at::Tensor& t = THPVariable_Unpack(o);
    if (t.requires_grad() || t.is_view()) Py_RETURN_FALSE;
    auto* impl = t.unsafeGetTensorImpl();
    for (const at::Tensor& x : ins)
      if (x.unsafeGetTensorImpl() == impl) Py_RETURN_FALSE;
    for (const at::Tensor& x : outs)
      if (x.unsafeGetTensorImpl() == impl) Py_RETURN_FALSE;
    outs.push_back(t);
  }
  Py_ssize_t size = 0;
  const char* name = PyUnicode_AsUTF8AndSize(args[4], &size);
  if (name == nullptr) return nullptr;
  NodePtr node = make_node<CustomFunctionBackward>(torch::autograd::collect_next_edges(ins), args[0], args[1],
                                                   std::string(name, static_cast<size_t>(size)));
  for (const at::Tensor& t : outs) {
    if (differentiable(t))
      torch::autograd::set_history(t, node);
    else  // (an integer output: no gradient flows, its cotangent comes as None)
      node->add_input_metadata(Node::undefined_input());
  }
  auto& saved = static_cast<CustomFunctionBackward&>(*node).saved;
  saved.reserve(n_in + n_out);
  for (const at::Tensor& t : ins) saved.emplace_back(t, /*is_output=*/false);
  for (const at::Tensor& t : outs) saved.emplace_back(t, /*is_output=*/true);
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef attach_def = {"attach", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(attach)),
                          METH_FASTCALL, "custom_function's C++ autograd node for one call (autodiff.py)"};

}  // namespace

// The builtin `attach` (ctypes hands it to autodiff.py with the GIL held).
KK_EXPORT PyObject* kk_attach_function() {
  return PyCFunction_New(&attach_def, nullptr);
}
