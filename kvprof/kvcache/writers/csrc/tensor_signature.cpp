// signature(*tensors) -> (bytes, addresses) or None: what an eager Triton write's launch depends
// on in its tensors, read in C++ (kvprof.kvcache.writers.triton_launch).
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
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>
#include <exception>

namespace {

constexpr int64_t kMaxDim = 8;
constexpr Py_ssize_t kMaxTensors = 32;

PyObject* signature(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs > kMaxTensors) Py_RETURN_NONE;
  char buf[kMaxTensors * (5 + 16 * kMaxDim)];
  size_t n = 0;
  uintptr_t addresses[kMaxTensors];
  try {
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      if (Py_TYPE(args[i]) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) Py_RETURN_NONE;
      const at::Tensor& t = THPVariable_Unpack(args[i]);
      const int64_t dim = t.dim();
      if (dim > kMaxDim) Py_RETURN_NONE;
      const c10::Device device = t.device();
      const uintptr_t address = reinterpret_cast<uintptr_t>(t.data_ptr());
      buf[n++] = static_cast<char>(t.scalar_type());
      buf[n++] = static_cast<char>(device.type());
      buf[n++] = static_cast<char>(device.index());
      buf[n++] = static_cast<char>(dim);
      buf[n++] = static_cast<char>((address & 15) == 0);
      std::memcpy(buf + n, t.sizes().data(), sizeof(int64_t) * dim);
      n += sizeof(int64_t) * dim;
      std::memcpy(buf + n, t.strides().data(), sizeof(int64_t) * dim);
      n += sizeof(int64_t) * dim;
      addresses[i] = address;
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

PyMethodDef kMethods[] = {
    {"signature", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(signature)), METH_FASTCALL,
     "signature(*tensors) -> (bytes, addresses) or None"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "kvprof_tensor_signature", nullptr, -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_kvprof_tensor_signature(void) { return PyModule_Create(&kModule); }
