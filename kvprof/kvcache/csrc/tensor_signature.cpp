// signature(*tensors) -> (bytes, addresses) or None: what an eager Triton write's launch depends
// on in its tensors, read in C++ (kvprof.kvcache.signature; kvprof.kvcache.writers.triton_launch).
//
// The bytes hold, per tensor: its scalar type, device type and index, rank, whether its address
// is a multiple of 16, its sizes and its strides. Two calls with equal bytes have tensors of the
// same dtypes, devices, shapes, strides and 16-byte alignment, which is everything a writer's
// launch plan and Triton's specialisation read of a tensor but its address. The addresses come
// back as Python ints, in order. None (the caller takes its Python path) for anything that is not
// exactly a torch.Tensor (a subclass may override data_ptr or the metadata through
// __torch_function__), for a tensor without storage (data_ptr throws: meta, functional wrappers)
// and for ranks above 8. Reading eight tensors this way takes a fraction of a microsecond; the
// same reads from Python take several.
//
// call_key(*args) -> bytes or None: one key for a whole call, what a writer contract's checks
// read of it (kvprof.kvcache.contracts.ChecksItsCalls.checked_call): each tensor as above plus its
// address, and each other argument by its exact type and value -- None, bool, int (64-bit),
// float, torch.dtype. None for any other argument (a subclass of int, a list, a tensor subclass)
// and for the tensors signature() refuses.
#include <Python.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>
#include <exception>

namespace {

constexpr int64_t kMaxDim = 8;
constexpr Py_ssize_t kMaxTensors = 32;

bool put_tensor(char* buf, size_t& n, const at::Tensor& t, uintptr_t& address);

PyObject* signature(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs > kMaxTensors) Py_RETURN_NONE;
  char buf[kMaxTensors * (5 + 16 * kMaxDim)];
  size_t n = 0;
  uintptr_t addresses[kMaxTensors];
  try {
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      if (Py_TYPE(args[i]) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) Py_RETURN_NONE;
      if (!put_tensor(buf, n, THPVariable_Unpack(args[i]), addresses[i])) Py_RETURN_NONE;
    }
  } catch (const std::exception&) {  // no storage (data_ptr), sparse layouts (strides)
    Py_RETURN_NONE;
  }
  PyObject* ptrs = PyTuple_New(nargs);
  if (ptrs == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* v = PyLong_FromUnsignedLongLong(addresses[i]);
    if (v == nullptr) {
      Py_DECREF(ptrs);
      return nullptr;
    }
    PyTuple_SET_ITEM(ptrs, i, v);
  }
  PyObject* key = PyBytes_FromStringAndSize(buf, static_cast<Py_ssize_t>(n));
  if (key == nullptr) {
    Py_DECREF(ptrs);
    return nullptr;
  }
  PyObject* out = PyTuple_Pack(2, key, ptrs);
  Py_DECREF(key);
  Py_DECREF(ptrs);
  return out;
}

// one tensor's bytes at buf + n (at most 5 + 16 * kMaxDim); false for one signature() refuses
bool put_tensor(char* buf, size_t& n, const at::Tensor& t, uintptr_t& address) {
  const int64_t dim = t.dim();
  if (dim > kMaxDim) return false;
  const c10::Device device = t.device();
  address = reinterpret_cast<uintptr_t>(t.data_ptr());
  buf[n++] = static_cast<char>(t.scalar_type());
  buf[n++] = static_cast<char>(device.type());
  buf[n++] = static_cast<char>(device.index());
  buf[n++] = static_cast<char>(dim);
  buf[n++] = static_cast<char>((address & 15) == 0);
  std::memcpy(buf + n, t.sizes().data(), sizeof(int64_t) * dim);
  n += sizeof(int64_t) * dim;
  std::memcpy(buf + n, t.strides().data(), sizeof(int64_t) * dim);
  n += sizeof(int64_t) * dim;
  return true;
}

PyObject* call_key(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs > kMaxTensors) Py_RETURN_NONE;
  char buf[kMaxTensors * (7 + 16 * kMaxDim + sizeof(uintptr_t))];
  size_t n = 0;
  try {
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      PyObject* a = args[i];
      PyTypeObject* type = Py_TYPE(a);
      if (type == reinterpret_cast<PyTypeObject*>(THPVariableClass)) {
        buf[n++] = 'T';
        uintptr_t address = 0;
        if (!put_tensor(buf, n, THPVariable_Unpack(a), address)) Py_RETURN_NONE;
        std::memcpy(buf + n, &address, sizeof(address));
        n += sizeof(address);
      } else if (a == Py_None) {
        buf[n++] = 'N';
      } else if (type == &PyBool_Type) {
        buf[n++] = 'B';
        buf[n++] = static_cast<char>(a == Py_True);
      } else if (type == &PyLong_Type) {
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
          PyErr_Clear();
          Py_RETURN_NONE;
        }
        buf[n++] = 'I';
        std::memcpy(buf + n, &v, sizeof(v));
        n += sizeof(v);
      } else if (type == &PyFloat_Type) {
        const double v = PyFloat_AS_DOUBLE(a);
        buf[n++] = 'F';
        std::memcpy(buf + n, &v, sizeof(v));
        n += sizeof(v);
      } else if (THPDtype_Check(a)) {
        buf[n++] = 'D';
        buf[n++] = static_cast<char>(reinterpret_cast<THPDtype*>(a)->scalar_type);
      } else {
        Py_RETURN_NONE;
      }
    }
  } catch (const std::exception&) {  // no storage (data_ptr), sparse layouts (strides)
    Py_RETURN_NONE;
  }
  return PyBytes_FromStringAndSize(buf, static_cast<Py_ssize_t>(n));
}

PyMethodDef kMethods[] = {
    {"signature", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(signature)), METH_FASTCALL,
     "signature(*tensors) -> (bytes, addresses) or None"},
    {"call_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(call_key)), METH_FASTCALL,
     "call_key(*args) -> bytes or None"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "kvprof_tensor_signature", nullptr, -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_kvprof_tensor_signature(void) { return PyModule_Create(&kModule); }
