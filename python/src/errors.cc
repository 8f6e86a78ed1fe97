// nibble.Error and its subclasses, one per nibble::ErrorCode. Where a built-in exception means
// the same, the subclass derives from it too (NotFound is a FileNotFoundError, InvalidArgument a
// ValueError, IoError an OSError), so `except FileNotFoundError` works as users expect.
#include <map>

#include "common.h"

namespace nibble_py {

namespace {

struct ErrorClass {
  nibble::ErrorCode code;
  const char* name;
  PyObject* extra_base;  // a built-in base besides nibble.Error, or nullptr
  const char* doc;
};

std::map<nibble::ErrorCode, PyObject*>& Classes() {
  static auto* classes = new std::map<nibble::ErrorCode, PyObject*>();  // lives as long as the module
  return *classes;
}

}  // namespace

void RegisterErrors(py::module_& m) {
  PyObject* base = PyErr_NewExceptionWithDoc(
      "nibble.Error", "A nibble call failed; .code is the library's error code name, str() its message.",
      PyExc_Exception, nullptr);
  if (base == nullptr) throw py::error_already_set();
  m.add_object("Error", py::reinterpret_steal<py::object>(base));
  const ErrorClass classes[] = {
      {nibble::ErrorCode::kInvalidArgument, "InvalidArgument", PyExc_ValueError,
       "A request, argument or value the caller can correct."},
      {nibble::ErrorCode::kNotFound, "NotFound", PyExc_FileNotFoundError,
       "A file, directory or tensor that does not exist."},
      {nibble::ErrorCode::kUnsupported, "Unsupported", nullptr,
       "Valid input nibble does not handle: a format, dtype or architecture."},
      {nibble::ErrorCode::kCorruptInput, "CorruptInput", nullptr,
       "A file whose bytes or structure are malformed or contradict each other."},
      {nibble::ErrorCode::kIo, "IoError", PyExc_OSError, "The OS failed a read, write, map or rename."},
      {nibble::ErrorCode::kResourceExhausted, "ResourceExhausted", nullptr,
       "A request that needs more memory than allowed, refused up front."},
      {nibble::ErrorCode::kCancelled, "Cancelled", nullptr,
       "A call stopped by cancellation (Ctrl-C raises KeyboardInterrupt instead)."},
      {nibble::ErrorCode::kInternal, "InternalError", nullptr, "A bug or an impossible state."},
  };
  for (const ErrorClass& c : classes) {
    PyObject* bases = c.extra_base ? PyTuple_Pack(2, base, c.extra_base) : PyTuple_Pack(1, base);
    if (bases == nullptr) throw py::error_already_set();
    const std::string qualified = std::string("nibble.") + c.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), c.doc, bases, nullptr);
    Py_DECREF(bases);
    if (cls == nullptr) throw py::error_already_set();
    m.add_object(c.name, py::reinterpret_borrow<py::object>(cls));
    Classes()[c.code] = cls;  // the module keeps the reference alive
    Py_DECREF(cls);
  }
  // InvalidInput: another name for InvalidArgument (input the caller can correct).
  m.attr("InvalidInput") = m.attr("InvalidArgument");
}

void ThrowError(const nibble::Error& e) {
  auto it = Classes().find(e.code);
  PyObject* cls = it != Classes().end() ? it->second : Classes().at(nibble::ErrorCode::kInternal);
  // A message may quote bytes of a file or path that are not UTF-8: shown as U+FFFD.
  py::object text = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(e.message.data(), static_cast<Py_ssize_t>(e.message.size()), "replace"));
  if (!text) throw py::error_already_set();
  py::object exc = py::reinterpret_steal<py::object>(PyObject_CallOneArg(cls, text.ptr()));
  if (!exc) throw py::error_already_set();
  exc.attr("code") = nibble::ErrorCodeName(e.code);
  PyErr_SetObject(cls, exc.ptr());
  throw py::error_already_set();
}

}  // namespace nibble_py
