// Shared by the binding's translation units: nibble::Error -> Python exception, and running a
// long library call off the GIL on a worker thread that Ctrl-C cancels.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nibble/nibble.h>

namespace nibble_py {

namespace py = pybind11;

/// Creates nibble.Error and one subclass per nibble::ErrorCode in `m`.
void RegisterErrors(py::module_& m);
/// Raises the exception class of `e.code` with e.message (and .code = ErrorCodeName) as the
/// pending Python error and throws py::error_already_set.
[[noreturn]] void ThrowError(const nibble::Error& e);

inline void ThrowIfError(const nibble::Status& s) {
  if (!s.ok()) ThrowError(s.error());
}
template <typename T>
T TakeOrThrow(nibble::Result<T>&& r) {
  if (!r.ok()) ThrowError(r.error());
  return std::move(r).value();
}

/// Every library call in flight on a worker thread is registered with its token (BeginCall on the
/// calling thread, EndCall by the worker as its last step), so that interpreter exit (atexit:
/// nibble._shutdown) cancels them all and waits for their workers before the process tears down
/// the libraries they run in.
int64_t BeginCall(const nibble::CancellationToken& token);
void EndCall(int64_t id);
/// Cancels every call in flight and waits (up to `seconds`) for their workers to return.
void CancelAllCalls(double seconds);

/// The thread that imported the module (the main thread, the one that finalizes the interpreter).
unsigned long ImportThread();

/// True once the interpreter is being finalized, on any thread but the one finalizing it: such a
/// thread must not take the GIL back (Python ends it with pthread_exit, whose forced unwind
/// through pybind11's frames would release Python objects without the GIL).
inline bool ShuttingDownOffMainThread() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  return finalizing && PyThread_get_thread_ident() != ImportThread();
}

/// Runs `f` with the GIL released. If the interpreter started finalizing meanwhile, a thread other
/// than the main one runs `stop` (still without the GIL: cancel and join its work) and then
/// sleeps until the process exits, as Python 3.14 parks daemon threads, instead of returning.
template <typename F, typename Stop>
void WithoutGil(F&& f, Stop&& stop) {
  PyThreadState* state = PyEval_SaveThread();
  try {
    f();
  } catch (...) {
    PyEval_RestoreThread(state);
    throw;
  }
  if (ShuttingDownOffMainThread()) {
    stop();
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  PyEval_RestoreThread(state);
}
template <typename F>
void WithoutGil(F&& f) {
  WithoutGil(std::forward<F>(f), [] {});
}

/// Called on the calling (GIL-holding) thread at every wait slice of RunCancellable: forwards
/// what the worker produced to Python callables (progress) and may raise.
using PollFn = std::function<void()>;

/// Runs `work(token)` on a worker thread while the calling thread waits with the GIL released,
/// waking every 50 ms to run `poll` and, on the main thread, to check for signals: Ctrl-C cancels
/// the token and, once the library call has returned (rolled back), KeyboardInterrupt is raised.
/// A Python exception from `poll` cancels the call the same way and is re-raised. `threads`
/// (>= 0) is the worker's compute thread count (nibble::SetNumThreads is per thread).
template <typename R>
R RunCancellable(int threads, const std::function<R(const nibble::CancellationToken*)>& work,
                 const PollFn& poll = nullptr) {
  nibble::CancellationToken token;
  std::optional<R> result;
  std::exception_ptr worker_exc;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  const int64_t call = BeginCall(token);
  std::thread worker([&] {
    try {
      nibble::SetNumThreads(threads);
      result.emplace(work(&token));
    } catch (...) {
      worker_exc = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    }
    EndCall(call);
  });
  // Joins the worker on every way out: a joinable std::thread destroyed would call std::terminate.
  struct JoinOnExit {
    std::thread& t;
    const nibble::CancellationToken& token;
    ~JoinOnExit() {
      if (!t.joinable()) return;
      token.Cancel();
      t.join();
    }
  } join_on_exit{worker, token};
  std::optional<py::error_already_set> raised;
  for (;;) {
    bool finished = false;
    WithoutGil([&] {
      std::unique_lock<std::mutex> lock(mu);
      finished = cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; });
    }, [&] {
      token.Cancel();
      worker.join();
    });
    if (!raised) {
      try {
        if (poll) poll();
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      } catch (py::error_already_set& e) {
        raised.emplace(std::move(e));
        token.Cancel();
      }
    }
    if (finished) break;
  }
  WithoutGil([&] { worker.join(); });
  if (raised) throw std::move(*raised);
  if (worker_exc) std::rethrow_exception(worker_exc);
  return std::move(*result);
}

/// A C++ vector handed to NumPy without a copy: the array owns it through a capsule.
template <typename T>
py::array_t<T> ToNumpy(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(shape, owned->data(), free_when_done);
}

/// A thread count argument: None = 0 (all cores, the library's default).
inline int ThreadsArg(const std::optional<int>& threads) { return threads.value_or(0); }

}  // namespace nibble_py
