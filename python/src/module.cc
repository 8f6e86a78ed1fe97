// The compiled part of `import nibble` (nibble._nibble); python/nibble/__init__.py re-exports it.
#include <map>

#include "model.h"

namespace nibble_py {

namespace {
unsigned long import_thread = 0;
}  // namespace

unsigned long ImportThread() { return import_thread; }

namespace {

struct Calls {
  std::mutex mu;
  std::condition_variable cv;
  int64_t next_id = 0;
  std::map<int64_t, nibble::CancellationToken> live;
};

Calls& InFlight() {
  static auto* calls = new Calls();  // never destroyed: workers may end after static teardown began
  return *calls;
}

}  // namespace

int64_t BeginCall(const nibble::CancellationToken& token) {
  Calls& c = InFlight();
  std::lock_guard<std::mutex> lock(c.mu);
  c.live.emplace(++c.next_id, token);
  return c.next_id;
}

void EndCall(int64_t id) {
  Calls& c = InFlight();
  std::lock_guard<std::mutex> lock(c.mu);
  c.live.erase(id);
  c.cv.notify_all();
}

void CancelAllCalls(double seconds) {
  Calls& c = InFlight();
  std::unique_lock<std::mutex> lock(c.mu);
  for (auto& [id, token] : c.live) token.Cancel();
  c.cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return c.live.empty(); });
}

}  // namespace nibble_py

PYBIND11_MODULE(_nibble, m) {
  nibble_py::import_thread = PyThread_get_thread_ident();
  m.doc() = "nibble: int4 quantization (RTN, AWQ, GPTQ) and CPU inference of Llama-family models";
  m.attr("__version__") = NIBBLE_VERSION;
  nibble_py::RegisterErrors(m);
  nibble_py::RegisterModel(m);
  nibble_py::RegisterSession(m);
  nibble_py::RegisterTools(m);
  nibble_py::RegisterCheckpoint(m);
  m.def("_shutdown", [] { nibble_py::WithoutGil([] { nibble_py::CancelAllCalls(30.0); }); },
        "Cancels every call in flight and waits for it (registered with atexit by __init__.py).");
}
