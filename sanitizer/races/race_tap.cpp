// The race check's native tap: sees every ATen op without a Python dispatch mode.
//
// A Python TorchDispatchMode costs a Python round trip per op, which alone
// doubles the step time of a launch-bound two-stream program. This tap is a
// global RecordFunction callback instead: it classifies each op's tensor
// arguments from its schema (as ops.py's plan does), computes their byte
// ranges, and keeps the history of memory that only a device's default
// stream has touched here, in C++. The happens-before engine (Python) sees
// only what can race:
//
// * an access from any other stream, and every later access to memory such
//   an access touched (the base becomes "shared");
// * the default stream's history of a base, handed over ("flushed") with its
//   original sequence numbers at the moment another stream first reaches it.
//
// Why that is exact: a base only the default stream has touched has no other
// stream's history, so its default-stream accesses cannot race when they are
// made; and for a later check, the latest write and the latest read per exact
// byte range (what is kept) give the engine the same per-byte history as
// feeding every access, since a dropped record is superseded on every byte it
// covered. Sequence numbers come from one counter (tick) that the engine also
// uses, so flushed history lands where it happened; before each
// synchronization the engine learns every stream's latest seq (latest()).
//
// Every piece of state is guarded by the GIL: a recorded op takes it once,
// to capture the user's stack (user_site: the user's frames only, as code
// objects and instruction offsets, turned into lines only for the few sites a
// report reads) and, rarely, to call back into the engine.
#include <torch/extension.h>
#include <frameobject.h>

#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#ifndef TORCHLINT_TRACE_FILTER
#define TORCHLINT_TRACE_FILTER 1
#endif
#if TORCHLINT_TRACE_FILTER
#include <c10/core/impl/GPUTrace.h>
#include <c10/core/impl/PyInterpreter.h>
#include <torch/csrc/PyInterpreter.h>
#endif
#include <torch/csrc/DynamicTypes.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

constexpr size_t kMaxLocalRanges = 16;  // per base; beyond it the base is shared

PyObject* new_ref(PyObject* object) {
  Py_XINCREF(object);
  return object;
}

struct PyRef {  // an owned reference, released under the GIL (all tap state is)
  PyObject* object = nullptr;
  PyRef() = default;
  explicit PyRef(PyObject* owned) : object(owned) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { Py_XDECREF(object); }
  void reset(PyObject* owned = nullptr) {
    PyObject* old = object;
    object = owned;
    Py_XDECREF(old);
  }
};

// -- op plans: how an op touches memory, from its schema ----------------------

enum class PlanKind : uint8_t { kSkip, kPlain, kRecordStream };

struct ArgPlan {
  int index = 0;
  bool write = false;
  bool list = false;
  std::string name;
};

struct Plan {
  PlanKind kind = PlanKind::kSkip;
  std::vector<ArgPlan> args;
  bool output_write = false;
  bool collective = false;
  std::string qualified;  // "aten::add": guards the name-pointer cache key
  std::string short_name;  // "add"
  PyObject* op_name = nullptr;  // short_name as a Python str, made under the GIL on first use
};

int tensor_shape_of(const c10::TypePtr& declared) {  // 0: no tensor, 1: a tensor, 2: a list
  c10::TypePtr type = declared;
  if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  if (type->kind() == c10::TypeKind::TensorType) return 1;
  if (auto list = type->cast<c10::ListType>()) {
    c10::TypePtr element = list->getElementType();
    if (auto optional = element->cast<c10::OptionalType>()) element = optional->getElementType();
    if (element->kind() == c10::TypeKind::TensorType) return 2;
  }
  return 0;
}

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

bool ends_with(const std::string& text, const char* suffix) {
  size_t n = std::strlen(suffix);
  return text.size() >= n && text.compare(text.size() - n, n, suffix) == 0;
}

std::unique_ptr<Plan> make_plan(const c10::FunctionSchema& schema) {
  auto plan = std::make_unique<Plan>();
  const std::string& qualified = schema.name();
  plan->qualified = qualified;
  size_t colon = qualified.find("::");
  std::string space = colon == std::string::npos ? "" : qualified.substr(0, colon);
  std::string name = colon == std::string::npos ? qualified : qualified.substr(colon + 2);
  plan->short_name = name;
  plan->collective = space == "c10d" || space == "_c10d_functional";
  if (name == "record_stream") {
    plan->kind = PlanKind::kRecordStream;
    return plan;
  }
  static const char* kNoWriteOutput[] = {"empty", "empty_like", "new_empty", "new_empty_strided",
                                         "empty_strided", "empty_permuted"};
  bool metadata_inputs = starts_with(name, "new_") || ends_with(name, "_like");
  const auto& arguments = schema.arguments();
  for (size_t index = 0; index < arguments.size(); ++index) {
    const auto& argument = arguments[index];
    int shape = tensor_shape_of(argument.type());
    if (!shape) continue;
    const c10::AliasInfo* alias = argument.alias_info();
    bool write = alias != nullptr && alias->isWrite();
    if (alias != nullptr && !write) continue;  // a view's base: no memory touched
    if (metadata_inputs && !write) continue;
    plan->args.push_back(ArgPlan{static_cast<int>(index), write, shape == 2, argument.name()});
  }
  bool no_write_output = false;
  for (const char* other : kNoWriteOutput) no_write_output |= name == other;
  if (!no_write_output) {
    for (const auto& ret : schema.returns()) {
      if (tensor_shape_of(ret.type()) && ret.alias_info() == nullptr) plan->output_write = true;
    }
  }
  plan->kind = plan->args.empty() && !plan->output_write ? PlanKind::kSkip : PlanKind::kPlain;
  return plan;
}

const ArgPlan kResult{-1, true, false, "result"};

// -- user sites -------------------------------------------------------------------
//
// A site is the user's frames at an op, innermost first: the frames.py
// selection (site_origin decides, once per code object, whether a frame is the
// user's, and whether it is a test file's), made during the walk so that it
// stops at the last frame kept. A frame is kept as its code object and
// instruction offset; the line is computed (and the Python tuple built) only
// when the site reaches the engine, which for most ops is never.

struct SiteFrame {
  PyObject* code = nullptr;  // a PyCodeObject, owned
  int position = -1;         // instruction offset (3.11+), or the line (older Pythons)
};

struct UserSite {  // shared by an op's records and a generation; freed under the GIL
  c10::SmallVector<SiteFrame, 4> frames;
  PyObject* as_tuple = nullptr;  // ((file, line, function), ...), built on first use
  UserSite() = default;
  UserSite(const UserSite&) = delete;
  UserSite& operator=(const UserSite&) = delete;
  ~UserSite() {
    for (SiteFrame& frame : frames) Py_XDECREF(frame.code);
    Py_XDECREF(as_tuple);
  }
};

using SitePtr = std::shared_ptr<UserSite>;

// -- what is recorded -----------------------------------------------------------

struct Generation {  // one owner (storage) of a base: who first touched it, and where
  uint64_t id = 0;
  int64_t nbytes = 0;
  uint64_t stream = 0;
  SitePtr site;
};

struct Launch {  // what every access of one op shares
  int64_t seq = 0;
  uint64_t stream = 0;
  const Plan* plan = nullptr;
  SitePtr site;
};

struct Access {  // one tensor argument, with what a report needs about the tensor
  int64_t start = 0, end = 0;
  bool write = false;
  const ArgPlan* arg = nullptr;
  int position = -1;  // in a tensor list
  c10::SmallVector<int64_t, 5> sizes, strides;
  bool contiguous = true;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  int64_t offset = 0;
  int64_t data = 0;
  int64_t base = 0;
  int device = 0;
  c10::intrusive_ptr<c10::StorageImpl> storage;  // held only while the op runs
};

struct Record {  // an access as remembered in a base's local history
  std::shared_ptr<Launch> launch;
  std::shared_ptr<Generation> generation;
  Access access;
};

struct Base {
  bool shared = false;
  const c10::StorageImpl* owner = nullptr;
  // Keeps the owner's StorageImpl object (not its memory) alive, so that a new
  // owner of the same bytes is always a different pointer.
  c10::weak_intrusive_ptr<c10::StorageImpl> owner_ref{c10::intrusive_ptr<c10::StorageImpl>()};
  std::shared_ptr<Generation> generation;
  std::vector<Record> history;  // local only: latest write and latest read per exact range
};

struct PendingOp : public at::ObserverContext {
  const Plan* plan = nullptr;
  std::vector<Access> accesses;
};

// -- the tap's state (all guarded by the GIL) ---------------------------------

struct Tap {
  bool enabled = false;
  bool manual_streams = false;  // tests: streams set from Python, CPU tensors
  c10::DeviceType device_type = c10::DeviceType::CUDA;
  uint64_t manual_stream = 0;
  at::CallbackHandle handle = 0;
  PyRef callback;  // engine side: callback(launches) and callback(("record_stream", ...))
  PyRef site_origin;  // frames.site_origin(filename) -> 0 not the user's, 1 a test file's, 2 the user's; or None
  size_t site_limit = 4;  // user frames kept per site (ops.SITE_FRAMES)
  std::unordered_map<PyObject*, int8_t> origins;  // code object (owned) -> site_origin of its file
  int64_t counter = 0;
  uint64_t generations = 0;
  std::unordered_map<const char*, std::unique_ptr<Plan>> plans;
  std::unordered_map<int64_t, Base> bases;
  std::unordered_map<uint64_t, int64_t> latest;  // stream -> seq of its latest launch
  std::unordered_set<uint64_t> dirty;  // streams whose latest changed since take_latest()
  size_t local_records = 0;
  // counters, for stats()
  std::atomic<uint64_t> ops_seen{0};  // counted off the GIL
  uint64_t ops_recorded = 0, accesses_local = 0, accesses_forwarded = 0, flushes = 0,
           callback_errors = 0, bases_erased = 0;
};

Tap& tap() {
  static Tap* instance = new Tap();  // never destroyed: it holds Python references
  return *instance;
}

thread_local int in_tap = 0;               // ops issued from inside the tap are not seen
// Ops nested in a recorded op (a composite's parts, copy_ inside _to_copy) are
// not recorded again: the outer op's schema already says what it touches, as
// a dispatch mode sees only the outer op. Ops nested in a skipped one (to,
// reshape, contiguous: views when they can be) are recorded.
thread_local int recording = 0;
thread_local int collectives_modelled = 0;  // c10d ops inside the collective wrapper (hooks.py)

bool is_main(uint64_t stream) { return (stream & ((uint64_t(1) << 56) - 1)) == 0; }

uint64_t stream_key(int device, int64_t id) {
  return (uint64_t(uint8_t(device)) << 56) | (uint64_t(id) & ((uint64_t(1) << 56) - 1));
}

uint64_t current_stream(int device) {
  Tap& t = tap();
  if (t.manual_streams) return t.manual_stream;
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return stream_key(device, guard->getStream(c10::Device(c10::DeviceType::CUDA, device)).id());
}

// Ops start on several threads (the autograd engine's too) without the GIL:
// the plan cache has its own lock, never held while the GIL is taken.
std::mutex plans_lock;

const Plan* plan_for(const at::RecordFunction& fn) {
  Tap& t = tap();
  const char* name = fn.name();
  {
    std::lock_guard<std::mutex> guard(plans_lock);
    auto found = t.plans.find(name);
    if (found != t.plans.end() && found->second->qualified == name) return found->second.get();
  }
  auto schema = fn.operator_schema();
  if (!schema) return nullptr;
  auto plan = make_plan(*schema);
  std::lock_guard<std::mutex> guard(plans_lock);
  auto& slot = t.plans[name];
  if (!slot || slot->qualified != name) slot = std::move(plan);  // plans are never freed: records point at them
  return slot.get();
}

void add_tensor(PendingOp& op, const at::Tensor& tensor, const ArgPlan* arg, int position, bool write) {
  if (!tensor.defined() || tensor.device().type() != tap().device_type || !tensor.has_storage()) return;
  if (tensor.unsafeGetTensorImpl()->is_wrapped_number()) return;  // a Python number, on the host
  int64_t itemsize = static_cast<int64_t>(tensor.dtype().itemsize());
  int64_t nbytes = tensor.numel() * itemsize;
  if (nbytes == 0) return;
  const c10::Storage& storage = tensor.storage();
  Access access;
  access.base = reinterpret_cast<int64_t>(storage.data_ptr().get());
  if (access.base == 0) return;
  access.offset = tensor.storage_offset();
  access.data = access.base + access.offset * itemsize;
  access.contiguous = tensor.is_contiguous();
  auto sizes = tensor.sizes();
  access.sizes.assign(sizes.begin(), sizes.end());
  if (access.contiguous) {
    access.start = access.data;
    access.end = access.data + nbytes;
  } else {
    auto strides = tensor.strides();
    access.strides.assign(strides.begin(), strides.end());
    int64_t low = 0, high = 0;
    for (size_t dim = 0; dim < sizes.size(); ++dim) {
      int64_t span = (sizes[dim] - 1) * strides[dim];
      if (strides[dim] >= 0) high += span; else low += span;
    }
    access.start = access.data + low * itemsize;
    access.end = access.data + (high + 1) * itemsize;
  }
  access.write = write;
  access.arg = arg;
  access.position = position;
  access.dtype = tensor.scalar_type();
  access.device = tensor.device().index() < 0 ? 0 : tensor.device().index();
  access.storage = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage.unsafeGetStorageImpl());
  op.accesses.push_back(std::move(access));
}

void add_value(PendingOp& op, const c10::IValue& value, const ArgPlan* arg, bool write) {
  if (value.isTensor()) {
    add_tensor(op, value.toTensor(), arg, -1, write);
  } else if (value.isList()) {
    int position = 0;
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor()) add_tensor(op, element.toTensor(), arg, position, write);
      ++position;
    }
  }
}

// -- conversion to what the engine takes ----------------------------------------

PyObject* int_tuple(const c10::SmallVector<int64_t, 5>& values) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) PyTuple_SET_ITEM(tuple, i, PyLong_FromLongLong(values[i]));
  return tuple;
}

PyObject* label_of(const Access& access) {
  if (access.position < 0) return PyUnicode_FromString(access.arg->name.c_str());
  return PyUnicode_FromFormat("%s[%d]", access.arg->name.c_str(), access.position);
}

// The site as the engine takes it: ((file, line, function), ...), () where no
// user frame was on the stack, None where sites are not captured. Borrowed.
PyObject* site_of(const SitePtr& site) {
  if (!site) return Py_None;
  if (site->as_tuple == nullptr) {
    PyObject* frames = PyTuple_New(static_cast<Py_ssize_t>(site->frames.size()));
    for (size_t i = 0; i < site->frames.size(); ++i) {
      auto* code = reinterpret_cast<PyCodeObject*>(site->frames[i].code);
#if PY_VERSION_HEX >= 0x030B0000
      int position = site->frames[i].position;
      int line = position < 0 ? code->co_firstlineno : PyCode_Addr2Line(code, position);
#else
      int line = site->frames[i].position;
#endif
      PyTuple_SET_ITEM(frames, i, Py_BuildValue("(OiO)", code->co_filename, line, code->co_name));
    }
    site->as_tuple = frames;
  }
  return site->as_tuple;
}

// (generation, site, stream, nbytes): who owns the bytes at a base
PyObject* generation_of(const Generation& generation) {
  return Py_BuildValue("(KOKL)", (unsigned long long)generation.id, site_of(generation.site),
                       (unsigned long long)generation.stream, (long long)generation.nbytes);
}

// (start, end, is_write, arg, (shape, dtype, offset, base, data_ptr, stride), base, generation)
PyObject* item_of(const Access& access, const Generation& generation) {
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(access.dtype));
  PyObject* stride = access.contiguous ? new_ref(Py_None) : int_tuple(access.strides);
  PyObject* tensor = Py_BuildValue("(NOLLLN)", int_tuple(access.sizes), dtype, (long long)access.offset,
                                   (long long)access.base, (long long)access.data, stride);
  return Py_BuildValue("(LLONNLN)", (long long)access.start, (long long)access.end,
                       access.write ? Py_True : Py_False, label_of(access), tensor, (long long)access.base,
                       generation_of(generation));
}

PyObject* op_name_of(const Plan* plan) {
  if (plan == nullptr) return Py_None;
  if (plan->op_name == nullptr) const_cast<Plan*>(plan)->op_name = PyUnicode_FromString(plan->short_name.c_str());
  return plan->op_name;
}

// (stream, seq, op, site, [items])
PyObject* launch_of(const Launch& launch, PyObject* items) {
  return Py_BuildValue("(KLOON)", (unsigned long long)launch.stream, (long long)launch.seq, op_name_of(launch.plan),
                       site_of(launch.site), items);
}

constexpr size_t kMaxKnownCode = 100000;  // code objects whose origin is remembered (exec in a loop makes new ones)
constexpr size_t kMaxTestFrames = 64;     // test-file frames kept while no other user frame is found

void forget_origins() {
  Tap& t = tap();
  for (auto& entry : t.origins) Py_DECREF(entry.first);
  t.origins.clear();
}

int origin_of(PyObject* code) {  // borrowed code object; GIL held
  Tap& t = tap();
  auto found = t.origins.find(code);
  if (found != t.origins.end()) return found->second;
  PyObject* result = PyObject_CallOneArg(t.site_origin.object, reinterpret_cast<PyCodeObject*>(code)->co_filename);
  long origin = result != nullptr ? PyLong_AsLong(result) : 0;
  Py_XDECREF(result);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    origin = 0;
  }
  if (t.origins.size() >= kMaxKnownCode) forget_origins();
  t.origins.emplace(new_ref(code), static_cast<int8_t>(origin));
  return static_cast<int>(origin);
}

// The user's frames at this point (frames.py's _select, on code objects), or
// nullptr where sites are not captured. GIL held. An empty site: no user frame
// (the autograd engine's threads have no Python frame at all).
SitePtr user_site() {
  Tap& t = tap();
  if (t.site_origin.object == nullptr || t.site_origin.object == Py_None) return nullptr;
  auto site = std::make_shared<UserSite>();
  auto& kept = site->frames;
  int first_non_test = -1;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyObject* code = reinterpret_cast<PyObject*>(PyFrame_GetCode(frame));  // new reference
    int origin = origin_of(code);
    bool done = false;
    if (origin > 0 && kept.size() < t.site_limit + kMaxTestFrames) {
      if (first_non_test < 0 && origin == 2) first_non_test = static_cast<int>(kept.size());
#if PY_VERSION_HEX >= 0x030B0000
      kept.push_back(SiteFrame{code, PyFrame_GetLasti(frame)});
#else
      kept.push_back(SiteFrame{code, PyFrame_GetLineNumber(frame)});
#endif
      code = nullptr;  // the site owns it now
      done = first_non_test >= 0 && kept.size() - first_non_test >= t.site_limit;
    }
    Py_XDECREF(code);
    PyFrameObject* back = done ? nullptr : PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  if (first_non_test > 0) {
    // Code under test is on the stack: the test frames inside it are not the site.
    for (int i = 0; i < first_non_test; ++i) Py_DECREF(kept[i].code);
    kept.erase(kept.begin(), kept.begin() + first_non_test);
  }
  while (kept.size() > t.site_limit) {
    Py_DECREF(kept.back().code);
    kept.pop_back();
  }
  return site;
}

// The base's local history as launches in seq order; the base becomes shared.
void flush(Base& base, std::vector<Record>& out) {
  Tap& t = tap();
  if (!base.history.empty()) ++t.flushes;
  t.local_records -= base.history.size();
  for (auto& record : base.history) out.push_back(std::move(record));
  base.history.clear();
  base.shared = true;
}

PyObject* launches_of(std::vector<Record>& records) {
  std::stable_sort(records.begin(), records.end(),
                   [](const Record& a, const Record& b) { return a.launch->seq < b.launch->seq; });
  PyObject* launches = PyList_New(0);
  size_t i = 0;
  while (i < records.size()) {
    PyObject* items = PyList_New(0);
    const Launch* launch = records[i].launch.get();
    for (; i < records.size() && records[i].launch.get() == launch; ++i) {
      PyObject* item = item_of(records[i].access, *records[i].generation);
      PyList_Append(items, item);
      Py_DECREF(item);
    }
    PyObject* entry = launch_of(*launch, items);
    PyList_Append(launches, entry);
    Py_DECREF(entry);
  }
  return launches;
}

void call_back(PyObject* argument) {
  Tap& t = tap();
  if (t.callback.object == nullptr) {
    Py_DECREF(argument);
    return;
  }
  PyObject* result = PyObject_CallOneArg(t.callback.object, argument);
  Py_DECREF(argument);
  if (result == nullptr) {
    ++t.callback_errors;
    PyErr_Clear();  // the engine side records its own errors; never break the user's op
  } else {
    Py_DECREF(result);
  }
}

void note_latest(uint64_t stream, int64_t seq) {
  Tap& t = tap();
  t.latest[stream] = seq;
  t.dirty.insert(stream);
}

// Keep the latest write and the latest read per exact range (a write also
// supersedes the read of its range, as in the engine).
void remember(Base& base, Record&& record) {
  Tap& t = tap();
  for (auto it = base.history.begin(); it != base.history.end();) {
    const Access& old = it->access;
    if (old.start == record.access.start && old.end == record.access.end &&
        (old.write == record.access.write || record.access.write)) {
      it = base.history.erase(it);
      --t.local_records;
    } else {
      ++it;
    }
  }
  base.history.push_back(std::move(record));
  ++t.local_records;
}

Base& base_of(Access& access, const std::shared_ptr<Launch>& launch) {
  Tap& t = tap();
  Base& base = t.bases[access.base];
  if (base.owner != access.storage.get()) {
    // Another StorageImpl at these bytes: a new owner, unless the current one
    // still holds them (an alias, e.g. through DLPack), which is the same allocation.
    auto current = base.owner_ref.lock();
    if (current && reinterpret_cast<int64_t>(current->data_ptr().get()) == access.base) return base;
    auto generation = std::make_shared<Generation>();
    generation->id = ++t.generations;
    generation->nbytes = static_cast<int64_t>(access.storage->nbytes());
    generation->stream = launch->stream;
    generation->site = launch->site;
    base.generation = std::move(generation);
    base.owner = access.storage.get();
    base.owner_ref = c10::weak_intrusive_ptr<c10::StorageImpl>(access.storage);
  }
  return base;
}

// One op with device accesses: GIL held.
void apply(PendingOp& op) {
  Tap& t = tap();
  ++t.ops_recorded;
  auto launch = std::make_shared<Launch>();
  launch->plan = op.plan;
  launch->stream = current_stream(op.accesses.front().device);
  launch->seq = ++t.counter;
  note_latest(launch->stream, launch->seq);
  launch->site = user_site();
  bool main = is_main(launch->stream);
  std::vector<Record> flushed;
  std::vector<Record> forwarded;
  for (Access& access : op.accesses) {
    Base& base = base_of(access, launch);
    Record record{launch, base.generation, std::move(access)};
    record.access.storage.reset();
    if (main && !base.shared) {
      ++t.accesses_local;
      remember(base, std::move(record));
      if (base.history.size() > kMaxLocalRanges) flush(base, flushed);
      continue;
    }
    ++t.accesses_forwarded;
    if (!base.shared) flush(base, flushed);
    forwarded.push_back(std::move(record));
  }
  if (flushed.empty() && forwarded.empty()) return;
  PyObject* launches = launches_of(flushed);
  if (!forwarded.empty()) {
    PyObject* current = launches_of(forwarded);
    PyList_Append(launches, PyList_GET_ITEM(current, 0));
    Py_DECREF(current);
  }
  call_back(launches);
}

// For a tensor the engine side handles itself (record_stream, Triton,
// collectives): share its base, handing its local history over as launches.
// Returns (launches, base, (generation, site, stream, nbytes)), or nullptr
// for a tensor the tap does not track (another device type, empty). GIL held.
PyObject* claim_tensor(const at::Tensor& tensor) {
  PendingOp op;
  add_tensor(op, tensor, &kResult, -1, false);
  if (op.accesses.empty()) return nullptr;
  Access& access = op.accesses.front();
  auto launch = std::make_shared<Launch>();
  launch->stream = current_stream(access.device);
  launch->site = user_site();  // where the tensor was first seen, if it is a new owner
  Base& base = base_of(access, launch);
  std::vector<Record> flushed;
  if (!base.shared) flush(base, flushed);
  return Py_BuildValue("(NLN)", launches_of(flushed), (long long)access.base, generation_of(*base.generation));
}

void record_stream(const at::RecordFunction& fn) {
  auto inputs = fn.inputs();
  if (inputs.size() < 2 || !inputs[0].isTensor() || !inputs[1].isStream()) return;
  c10::Stream pledged = inputs[1].toStream();
  PyGILState_STATE gil = PyGILState_Ensure();
  ++in_tap;
  PyObject* claimed = claim_tensor(inputs[0].toTensor());
  if (claimed != nullptr) {
    uint64_t stream = stream_key(pledged.device_index(), pledged.id());
    call_back(Py_BuildValue("(sNK)", "record_stream", claimed, (unsigned long long)stream));
  }
  --in_tap;
  PyGILState_Release(gil);
}

std::unique_ptr<at::ObserverContext> start_op(const at::RecordFunction& fn) {
  Tap& t = tap();
  if (!t.enabled || in_tap || recording) return nullptr;
  t.ops_seen.fetch_add(1, std::memory_order_relaxed);
  const Plan* plan = plan_for(fn);
  if (plan == nullptr || plan->kind == PlanKind::kSkip) return nullptr;
  if (plan->collective && collectives_modelled) return nullptr;
  if (plan->kind == PlanKind::kRecordStream) {
    record_stream(fn);
    return nullptr;
  }
  auto op = std::make_unique<PendingOp>();
  op->plan = plan;
  op->accesses.reserve(plan->args.size() + (plan->output_write ? 1 : 0));
  auto inputs = fn.inputs();
  for (const ArgPlan& arg : plan->args) {
    if (arg.index < static_cast<int>(inputs.size())) add_value(*op, inputs[arg.index], &arg, arg.write);
  }
  if (op->accesses.empty() && !plan->output_write) return nullptr;
  ++recording;
  return op;
}

void end_op(const at::RecordFunction& fn, at::ObserverContext* context) {
  auto* op = static_cast<PendingOp*>(context);
  if (op == nullptr) return;
  --recording;
  if (op->plan->output_write) {
    for (const c10::IValue& value : fn.outputs()) add_value(*op, value, &kResult, true);
  }
  if (op->accesses.empty() || !tap().enabled || !Py_IsInitialized()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  ++in_tap;
  apply(*op);
  --in_tap;
  op->accesses.clear();  // drops the storage references under the GIL-free path too
  PyGILState_Release(gil);
}

std::atomic<uint64_t> internal_errors{0};
std::mutex error_lock;
std::string first_error;  // the first internal error's message, for stats()

void note_error(const char* what) {
  internal_errors.fetch_add(1);
  std::lock_guard<std::mutex> guard(error_lock);
  if (first_error.empty()) first_error = what;
}

// Never break the user's op: a failure costs this op's record, and is counted.
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  try {
    return start_op(fn);  // a context is returned only with ``recording`` raised
  } catch (const std::exception& error) {
    note_error(error.what());
  } catch (...) {
    note_error("unknown exception");
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  try {
    end_op(fn, context);
  } catch (const std::exception& error) {
    note_error(error.what());
  } catch (...) {
    note_error("unknown exception");
  }
}

// -- Python API -----------------------------------------------------------------

// A check's figures are its own: the counters restart at every enable (one
// check at a time holds the tap), so a second session in a process (the next
// test) does not report the first one's ops or errors as its own.
void reset_counters(Tap& t) {
  t.ops_seen.store(0);
  t.ops_recorded = t.accesses_local = t.accesses_forwarded = t.flushes = t.callback_errors = t.bases_erased = 0;
  internal_errors.store(0);
  std::lock_guard<std::mutex> guard(error_lock);
  first_error.clear();
}

void enable(py::object callback, py::object site_origin, bool manual_streams, size_t site_limit) {
  Tap& t = tap();
  reset_counters(t);
  t.callback.reset(new_ref(callback.ptr()));
  t.site_origin.reset(new_ref(site_origin.ptr()));
  t.site_limit = site_limit;
  t.manual_streams = manual_streams;
  t.device_type = manual_streams ? c10::DeviceType::CPU : c10::DeviceType::CUDA;
  t.manual_stream = 0;
  t.enabled = true;
  if (t.handle == 0) {
    t.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                         .needsInputs(true)
                                         .needsOutputs(true)
                                         .scopes({at::RecordScope::FUNCTION}));
  }
}

void disable() {
  Tap& t = tap();
  t.enabled = false;
  if (t.handle != 0) {
    at::removeCallback(t.handle);
    t.handle = 0;
  }
  t.bases.clear();
  t.latest.clear();
  t.dirty.clear();
  t.local_records = 0;
  t.callback.reset();
  t.site_origin.reset();
  forget_origins();
}

// -- gpu_trace without a Python round trip per allocation -------------------------
//
// Once gpu_trace is on, torch's C++ side calls into Python (GIL, module
// import, two attribute lookups, the registry's fire_callbacks) for every CUDA
// event, sync and stream creation, and for every block the caching allocator
// hands out or takes back: about 3 us each on an H100 host, two per
// short-lived tensor. Under the tap the check needs no memory event (it sees a
// new owner of the bytes itself), so while the tap runs GPUTrace points at this
// interpreter instead of torch's: it forwards the events and syncs to torch's
// own (the Python callbacks see them as before) and drops allocations and
// frees, unless something else listens to them (``forward_memory``). GPUTrace's
// state is two public statics, so the interpreter it held before is restored
// when the check stops (remove_trace_filter): after the session, no callback of
// any kind reaches Python unless gpu_trace was on before it. Built only where the torch headers match
// the vtable below (TORCHLINT_TRACE_FILTER); otherwise native_tap.py builds the
// tap without it and the check switches torch's gpu_trace on as the fallback does.
#if TORCHLINT_TRACE_FILTER
using c10::impl::PyInterpreterVTable;
using c10::TensorImpl;

struct FilteredTrace final : PyInterpreterVTable {
  const PyInterpreterVTable* real = nullptr;  // torch's interpreter: everything else goes there
  std::atomic<bool> forward_memory{false};

  // Before activation (prehistory.py): the blocks the allocator handed
  // out since the last host sync, still live. A host sync is any device,
  // stream or event synchronization torch reports, implicit ones (.item(),
  // blocking copies) included: they go through the same c10::cuda functions
  // that sync debug mode watches. Activation then needs one snapshot instead of
  // one per sync (about 0.4 ms each on a transformer's allocator).
  std::atomic<bool> track_allocations{false};
  mutable std::mutex ledger_mutex;
  mutable std::unordered_set<uintptr_t> allocated_since_sync;
  mutable uint64_t host_syncs = 0;

  void note_allocation(uintptr_t ptr) const {
    if (!track_allocations.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> hold(ledger_mutex);
    allocated_since_sync.insert(ptr);
  }
  void note_free(uintptr_t ptr) const {
    if (!track_allocations.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> hold(ledger_mutex);
    allocated_since_sync.erase(ptr);
  }
  void note_host_sync() const {
    if (!track_allocations.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> hold(ledger_mutex);
    allocated_since_sync.clear();
    ++host_syncs;
  }

  std::string name() const override { return real->name(); }
  void incref(PyObject* o) const override { real->incref(o); }
  void decref(PyObject* o) const override { real->decref(o); }
  bool try_incref(const c10::impl::PyObjectSlot& slot) const override { return real->try_incref(slot); }
  size_t refcnt(PyObject* o) const override { return real->refcnt(o); }
  c10::intrusive_ptr<TensorImpl> detach(const TensorImpl* self) const override { return real->detach(self); }
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) const override { real->dispatch(op, stack); }
  void reportErrorCallback(PyObject* callback, c10::DispatchKey key) const override {
    real->reportErrorCallback(callback, key);
  }
  void python_op_registration_trampoline(const c10::OperatorHandle& op, c10::DispatchKey key,
                                         c10::DispatchKeySet keyset, torch::jit::Stack* stack, bool with_keyset,
                                         bool with_op) const override {
    real->python_op_registration_trampoline(op, key, keyset, stack, with_keyset, with_op);
  }
  void throw_abstract_impl_not_imported_error(std::string opname, const char* pymodule,
                                              const char* context) const override {
    real->throw_abstract_impl_not_imported_error(std::move(opname), pymodule, context);
  }
  void python_dispatcher(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                         torch::jit::Stack* stack) const override {
    real->python_dispatcher(op, keys, stack);
  }
  bool is_contiguous(const TensorImpl* self, at::MemoryFormat format) const override {
    return real->is_contiguous(self, format);
  }
  c10::SymBool sym_is_contiguous(const TensorImpl* self, at::MemoryFormat format) const override {
    return real->sym_is_contiguous(self, format);
  }
  bool is_strides_like(const TensorImpl* self, at::MemoryFormat format) const override {
    return real->is_strides_like(self, format);
  }
  bool is_non_overlapping_and_dense(const TensorImpl* self) const override {
    return real->is_non_overlapping_and_dense(self);
  }
  c10::Device device(const TensorImpl* self) const override { return real->device(self); }
  int64_t dim(const TensorImpl* self) const override { return real->dim(self); }
  c10::IntArrayRef strides(const TensorImpl* self) const override { return real->strides(self); }
  c10::IntArrayRef sizes(const TensorImpl* self) const override { return real->sizes(self); }
  c10::SymIntArrayRef sym_sizes(const TensorImpl* self) const override { return real->sym_sizes(self); }
  c10::Layout layout(const TensorImpl* self) const override { return real->layout(self); }
  int64_t numel(const TensorImpl* self) const override { return real->numel(self); }
  c10::SymInt sym_numel(const TensorImpl* self) const override { return real->sym_numel(self); }
  c10::SymIntArrayRef sym_strides(const TensorImpl* self) const override { return real->sym_strides(self); }
  c10::SymInt sym_storage_offset(const TensorImpl* self) const override { return real->sym_storage_offset(self); }
  void reset_backward_hooks(const TensorImpl* self) const override { real->reset_backward_hooks(self); }

  void trace_gpu_event_creation(c10::DeviceType type, uintptr_t event) const override {
    real->trace_gpu_event_creation(type, event);
  }
  void trace_gpu_event_deletion(c10::DeviceType type, uintptr_t event) const override {
    real->trace_gpu_event_deletion(type, event);
  }
  void trace_gpu_event_record(c10::DeviceType type, uintptr_t event, uintptr_t stream) const override {
    real->trace_gpu_event_record(type, event, stream);
  }
  void trace_gpu_event_wait(c10::DeviceType type, uintptr_t event, uintptr_t stream) const override {
    real->trace_gpu_event_wait(type, event, stream);
  }
  void trace_gpu_memory_allocation(c10::DeviceType type, uintptr_t ptr) const override {
    note_allocation(ptr);
    if (forward_memory.load(std::memory_order_relaxed)) real->trace_gpu_memory_allocation(type, ptr);
  }
  void trace_gpu_memory_deallocation(c10::DeviceType type, uintptr_t ptr) const override {
    note_free(ptr);
    if (forward_memory.load(std::memory_order_relaxed)) real->trace_gpu_memory_deallocation(type, ptr);
  }
  void trace_gpu_stream_creation(c10::DeviceType type, uintptr_t stream) const override {
    real->trace_gpu_stream_creation(type, stream);
  }
  void trace_gpu_device_synchronization(c10::DeviceType type) const override {
    note_host_sync();
    real->trace_gpu_device_synchronization(type);
  }
  void trace_gpu_stream_synchronization(c10::DeviceType type, uintptr_t stream) const override {
    note_host_sync();
    real->trace_gpu_stream_synchronization(type, stream);
  }
  void trace_gpu_event_synchronization(c10::DeviceType type, uintptr_t event) const override {
    note_host_sync();
    real->trace_gpu_event_synchronization(type, event);
  }
};

struct TraceFilter {
  FilteredTrace vtable;
  c10::impl::PyInterpreter interpreter{&vtable};
  bool installed = false;
  const c10::impl::PyInterpreter* replaced = nullptr;  // what GPUTrace held before
  bool replaced_have_state = false;
};

TraceFilter& trace_filter() {
  static TraceFilter* instance = new TraceFilter();  // never destroyed: another thread may be inside it
  return *instance;
}

bool install_trace_filter(bool forward_memory) {
  TraceFilter& f = trace_filter();
  f.vtable.real = &**getPyInterpreter();
  f.vtable.forward_memory.store(forward_memory);
  if (!f.installed) {
    f.replaced = c10::impl::GPUTrace::gpuTraceState.load(std::memory_order_acquire);
    f.replaced_have_state = c10::impl::GPUTrace::haveState;
    c10::impl::GPUTrace::gpuTraceState.store(&f.interpreter, std::memory_order_release);
    c10::impl::GPUTrace::haveState = true;
    f.installed = true;
  }
  return true;
}

void remove_trace_filter() {
  TraceFilter& f = trace_filter();
  if (!f.installed) return;
  f.vtable.track_allocations.store(false);
  {
    std::lock_guard<std::mutex> hold(f.vtable.ledger_mutex);
    f.vtable.allocated_since_sync.clear();
  }
  // Whoever replaced the filter since (CSAN's _activate_gpu_trace) keeps GPUTrace.
  if (c10::impl::GPUTrace::gpuTraceState.load(std::memory_order_acquire) == &f.interpreter) {
    c10::impl::GPUTrace::gpuTraceState.store(f.replaced, std::memory_order_release);
    c10::impl::GPUTrace::haveState = f.replaced_have_state;
  }
  f.installed = false;
}

bool trace_filter_installed() { return trace_filter().installed; }

// True while GPUTrace still holds this filter (a later torch._C._activate_gpu_trace,
// CSAN's, replaces it: the filter then sees nothing).
bool trace_filter_intact() {
  TraceFilter& f = trace_filter();
  return f.installed && c10::impl::GPUTrace::gpuTraceState.load(std::memory_order_acquire) == &f.interpreter;
}

void track_allocations_since_sync() {
  FilteredTrace& v = trace_filter().vtable;
  std::lock_guard<std::mutex> hold(v.ledger_mutex);
  v.allocated_since_sync.clear();
  v.host_syncs = 0;
  v.track_allocations.store(true);
}

// (host syncs seen, addresses of the blocks handed out since the last one and
// still live); tracking stops here.
py::tuple take_allocations_since_sync() {
  FilteredTrace& v = trace_filter().vtable;
  std::vector<uintptr_t> addresses;
  uint64_t syncs;
  {
    std::lock_guard<std::mutex> hold(v.ledger_mutex);
    v.track_allocations.store(false);
    addresses.assign(v.allocated_since_sync.begin(), v.allocated_since_sync.end());
    syncs = v.host_syncs;
    v.host_syncs = 0;
    v.allocated_since_sync.clear();
  }
  py::list out;
  for (uintptr_t address : addresses) out.append(py::int_(address));
  return py::make_tuple(syncs, out);
}

// For the CPU tests, which have no CUDA to make torch call the filter: one
// gpu_trace call, as torch would make it.
void feed_trace_filter(const std::string& kind, uintptr_t value) {
  TraceFilter& f = trace_filter();
  TORCH_CHECK(f.installed, "the gpu_trace filter is not installed");
  const FilteredTrace& v = f.vtable;
  if (kind == "allocation") v.trace_gpu_memory_allocation(c10::DeviceType::CUDA, value);
  else if (kind == "free") v.trace_gpu_memory_deallocation(c10::DeviceType::CUDA, value);
  else if (kind == "device_sync") v.trace_gpu_device_synchronization(c10::DeviceType::CUDA);
  else if (kind == "stream_sync") v.trace_gpu_stream_synchronization(c10::DeviceType::CUDA, value);
  else if (kind == "event_sync") v.trace_gpu_event_synchronization(c10::DeviceType::CUDA, value);
  else TORCH_CHECK(false, "unknown gpu_trace call: ", kind);
}
#endif

int64_t tick() { return ++tap().counter; }

size_t local_records() { return tap().local_records; }

py::list take_latest() {
  Tap& t = tap();
  py::list out;
  for (uint64_t stream : t.dirty) out.append(py::make_tuple(stream, t.latest[stream]));
  t.dirty.clear();
  return out;
}

py::object claim(const at::Tensor& tensor) {
  PyObject* claimed = claim_tensor(tensor);
  return claimed ? py::reinterpret_steal<py::object>(claimed) : py::none();
}

// Drops the local history every stream is ordered after (``floor``: stream ->
// the seq up to which all present and future streams are ordered after it, the
// engine's garbage-collection floor). A base left with no history whose
// owner is gone is dropped too: its next owner would start a new generation
// anyway, so it holds nothing, and a program that touches many short-lived
// addresses on one stream would otherwise keep one base per address. A shared
// base stays: the engine still holds its history, and the next owner of its
// bytes must reach the engine (a reuse the old owner's streams did not wait for).
void prune(const std::unordered_map<uint64_t, int64_t>& floor) {
  Tap& t = tap();
  for (auto entry = t.bases.begin(); entry != t.bases.end();) {
    Base& base = entry->second;
    auto& history = base.history;
    for (auto it = history.begin(); it != history.end();) {
      auto bound = floor.find(it->launch->stream);
      if (bound != floor.end() && it->launch->seq <= bound->second) {
        it = history.erase(it);
        --t.local_records;
      } else {
        ++it;
      }
    }
    if (!base.shared && history.empty() && base.owner_ref.expired()) {
      entry = t.bases.erase(entry);
      ++t.bases_erased;
    } else {
      ++entry;
    }
  }
}

void set_stream(uint64_t stream) { tap().manual_stream = stream; }

void enter_collective() { ++collectives_modelled; }
void exit_collective() { --collectives_modelled; }

py::dict stats() {
  Tap& t = tap();
  py::dict out;
  out["ops_seen"] = t.ops_seen.load();
  out["ops_recorded"] = t.ops_recorded;
  out["accesses_local"] = t.accesses_local;
  out["accesses_forwarded"] = t.accesses_forwarded;
  out["flushes"] = t.flushes;
  out["local_records"] = t.local_records;
  out["bases"] = t.bases.size();
  out["bases_erased"] = t.bases_erased;
  out["callback_errors"] = t.callback_errors;
  out["internal_errors"] = internal_errors.load();
  std::lock_guard<std::mutex> guard(error_lock);
  out["first_error"] = first_error;
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torchlint race check: the native op tap";
  m.def("enable", &enable, py::arg("callback"), py::arg("site_origin"), py::arg("manual_streams") = false,
        py::arg("site_limit") = 4);
  m.def("disable", &disable);
  m.def("tick", &tick);
  m.def("take_latest", &take_latest);
  m.def("claim", &claim);
  m.def("prune", &prune);
  m.def("set_stream", &set_stream);
  m.def("enter_collective", &enter_collective);
  m.def("exit_collective", &exit_collective);
  m.def("stats", &stats);
  m.def("local_records", &local_records);
#if TORCHLINT_TRACE_FILTER
  m.def("install_trace_filter", &install_trace_filter, py::arg("forward_memory"));
  m.def("remove_trace_filter", &remove_trace_filter);
  m.def("trace_filter_installed", &trace_filter_installed);
  m.def("trace_filter_intact", &trace_filter_intact);
  m.def("track_allocations_since_sync", &track_allocations_since_sync);
  m.def("take_allocations_since_sync", &take_allocations_since_sync);
  m.def("_feed_trace_filter", &feed_trace_filter, py::arg("kind"), py::arg("value") = 0);
#endif
}
