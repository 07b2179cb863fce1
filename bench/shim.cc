// The benchmark shim: the C API of bench/xte_bench.h on top of Google Benchmark. The only C++
// in xte. Cases are kept here when registered and handed to Google Benchmark by
// xte_bench_run() (those whose name contains the filter, plus the anchors they name), each timed
// in real time (the work runs on xte's thread pool, not on the timing thread). A reporter
// records every run so that the ratio table "case / anchor" is printed from the same process,
// and appended to the JSON report as "xte_ratios".
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "xte/xte.h"
#include "xte_bench.h"

struct xte_bench_state {
  benchmark::State *s;
  double bytes, flops;
};

namespace {

struct Case {
  std::string name, anchor, metric, library;
  xte_bench_fn fn;
  void *arg;
  double bytes = 0, flops = 0;  // per iteration, from the last call
};

struct Result {
  std::vector<double> times;  // real time per iteration, one per round
  bool error = false;
  std::string message;
  bool have = false;
};

std::vector<Case> &cases() {
  static std::vector<Case> c;
  return c;
}

std::map<std::string, Result> &results() {
  static std::map<std::string, Result> r;
  return r;
}

// Libraries distrusted for this run (xte_bench_distrust), with the reason.
std::map<std::string, std::string> &distrusted() {
  static std::map<std::string, std::string> d;
  return d;
}

// Why a ratio between cases a and b may not be printed ("" when it may).
std::string refusal(const Case &a, const Case *b) {
  for (const Case *c : {&a, b}) {
    if (!c || c->library.empty()) continue;
    auto it = distrusted().find(c->library);
    if (it != distrusted().end()) return c->library + ": " + it->second;
  }
  return "";
}

class Recorder : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run> &reports) override {
    for (const Run &r : reports) {
      if (r.run_type != Run::RT_Iteration) continue;
      Result &res = results()[r.run_name.function_name];
      res.have = true;
      res.error = r.error_occurred;
      res.message = r.error_message;
      double t = r.iterations > 0 ? r.real_accumulated_time / (double)r.iterations : 0;
      if (!r.error_occurred && t > 0) res.times.push_back(t);
    }
    ConsoleReporter::ReportRuns(reports);
  }
};

const Case *find_case(const std::string &name) {
  for (const Case &c : cases())
    if (c.name == name) return &c;
  return nullptr;
}

// Medians over the rounds: a round disturbed by the machine, either way, does not decide.
double median(std::vector<double> t) {
  size_t n = t.size();
  if (n == 0) return 0;
  std::sort(t.begin(), t.end());
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

double work_of(const Case &c) {
  return c.metric == "GFLOP/s" ? c.flops : c.bytes;
}

double rate_of(const Case &c, const Result &r) {
  double sec = median(r.times);
  if (!r.have || r.error || sec <= 0) return NAN;
  return work_of(c) > 0 ? work_of(c) / sec * 1e-9 : NAN;
}

// Case c against its anchor a (in c's metric): with several rounds, the median of the rounds'
// ratios, each round's case against the same round's anchor (the machine's load drifts slower
// than a round); else the ratio of the rates.
double ratio_of(const Case &c, const Result &rc, const Case &a, const Result &ra) {
  if (rc.times.size() > 1 && rc.times.size() == ra.times.size() && work_of(c) > 0 &&
      work_of(a) > 0) {
    std::vector<double> q;
    for (size_t i = 0; i < rc.times.size(); i++)
      q.push_back((work_of(c) / rc.times[i]) / (work_of(a) / ra.times[i]));
    return median(q);
  }
  return rate_of(c, rc) / rate_of(a, ra);
}

struct Row {
  std::string name, metric, anchor;
  double rate, anchor_rate, ratio;
  std::string refused;
};

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string json_string(const std::string &s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    o += ch;
  }
  return o + "\"";
}

// Appends "xte_ratios": [...] to the JSON object Google Benchmark wrote.
void append_ratios(const char *path, const std::vector<Row> &rows) {
  std::ifstream in(path);
  if (!in) return;
  std::stringstream ss;
  ss << in.rdbuf();
  in.close();
  std::string text = ss.str();
  size_t end = text.rfind('}');
  if (end == std::string::npos) return;
  std::string add = ",\n  \"xte_ratios\": [";
  for (size_t i = 0; i < rows.size(); i++) {
    const Row &r = rows[i];
    add += i ? ",\n    {" : "\n    {";
    add += "\"name\": " + json_string(r.name) + ", \"metric\": " + json_string(r.metric) +
           ", \"rate\": " + json_number(r.rate) + ", \"anchor\": " + json_string(r.anchor) +
           ", \"anchor_rate\": " + json_number(r.anchor_rate) +
           ", \"ratio\": " + json_number(r.ratio);
    if (!r.refused.empty()) add += ", \"refused\": " + json_string(r.refused);
    add += "}";
  }
  add += "\n  ]\n";
  // Drop the whitespace before the closing brace, then close again.
  size_t cut = end;
  while (cut > 0 && (text[cut - 1] == '\n' || text[cut - 1] == ' ')) cut--;
  text = text.substr(0, cut) + add + "}\n";
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

}  // namespace

extern "C" {

int xte_bench_keep_running(xte_bench_state *st) {
  return st->s->KeepRunning() ? 1 : 0;
}

void xte_bench_pause(xte_bench_state *st) {
  st->s->PauseTiming();
}

void xte_bench_resume(xte_bench_state *st) {
  st->s->ResumeTiming();
}

void xte_bench_set_bytes(xte_bench_state *st, double bytes_per_iter) {
  st->bytes = bytes_per_iter;
}

void xte_bench_set_flops(xte_bench_state *st, double flops_per_iter) {
  st->flops = flops_per_iter;
}

void xte_bench_fail(xte_bench_state *st, const char *why) {
  st->s->SkipWithError(why ? why : "failed");
}

void xte_bench_uses(const char *name, const char *library) {
  for (Case &c : cases())
    if (name && c.name == name) c.library = library ? library : "";
}

void xte_bench_distrust(const char *library, const char *why) {
  if (library) distrusted()[library] = why ? why : "distrusted";
}

void xte_bench_register(const char *name, const char *anchor, const char *metric, xte_bench_fn fn,
                        void *arg) {
  Case c;
  c.name = name ? name : "";
  c.anchor = anchor ? anchor : "";
  c.metric = metric ? metric : "GB/s";
  c.fn = fn;
  c.arg = arg;
  for (Case &old : cases())
    if (old.name == c.name) {  // registered again: the latest wins
      old = c;
      return;
    }
  cases().push_back(c);
}

int xte_bench_run(const char *filter, const char *json_path, double min_time_s, int rounds) {
  std::vector<std::string> args = {"xte"};
  if (json_path && *json_path) {
    args.push_back(std::string("--benchmark_out=") + json_path);
    args.push_back("--benchmark_out_format=json");
  }
  std::vector<char *> argv;
  for (std::string &a : args) argv.push_back(&a[0]);
  int argc = (int)argv.size();
  argv.push_back(nullptr);
  benchmark::Initialize(&argc, argv.data());

  {
    char info[4096];
    if (xte_backend_info_string(info, sizeof info) == XTE_SUCCESS)
      benchmark::AddCustomContext("xte_backend", info);
    // the machine record (bench/bench_common.h): CPU, ISA, threads, caches, huge pages, load,
    // OpenBLAS's core / threads / config and whether its ratios are trusted
    for (int i = 0; i < xte_bench_machine_count(); i++)
      benchmark::AddCustomContext(xte_bench_machine_key(i), xte_bench_machine_value(i));
  }

  // The selected cases, and the anchors they are compared with.
  std::vector<bool> want(cases().size(), false);
  for (size_t i = 0; i < cases().size(); i++)
    if (!filter || !*filter || cases()[i].name.find(filter) != std::string::npos) want[i] = true;
  for (size_t i = 0; i < cases().size(); i++) {
    if (!want[i] || cases()[i].anchor.empty()) continue;
    for (size_t j = 0; j < cases().size(); j++)
      if (cases()[j].name == cases()[i].anchor) want[j] = true;
  }

  benchmark::ClearRegisteredBenchmarks();
  results().clear();
  int n = 0;
  for (size_t i = 0; i < cases().size(); i++) {
    if (!want[i]) continue;
    n++;
    Case *c = &cases()[i];
    benchmark::internal::Benchmark *b =
        benchmark::RegisterBenchmark(c->name.c_str(), [c](benchmark::State &state) {
          xte_bench_state st{&state, 0, 0};
          c->fn(&st, c->arg);
          c->bytes = st.bytes;
          c->flops = st.flops;
          if (st.bytes > 0)
            state.SetBytesProcessed((int64_t)(st.bytes * (double)state.iterations()));
          if (st.flops > 0)
            state.counters["FLOP/s"] = benchmark::Counter(st.flops * (double)state.iterations(),
                                                          benchmark::Counter::kIsRate);
          if (!c->anchor.empty()) state.SetLabel("vs " + c->anchor);
        });
    b->UseRealTime()->Unit(benchmark::kMicrosecond);
    if (min_time_s > 0) b->MinTime(min_time_s);
  }
  if (n == 0) {
    std::fprintf(stderr, "xte bench: no case matches filter '%s'\n", filter ? filter : "");
    return 2;
  }

  Recorder rec;
  for (int r = 0; r < (rounds > 1 ? rounds : 1); r++) {
    if (rounds > 1) std::printf("round %d of %d\n", r + 1, rounds);
    benchmark::RunSpecifiedBenchmarks(&rec);
  }

  // The ratio table.
  std::vector<Row> rows;
  bool failed = false;
  size_t w = 4;
  for (size_t i = 0; i < cases().size(); i++)
    if (want[i]) w = std::max(w, cases()[i].name.size());
  std::printf("\n%-*s %12s  %-*s %12s %8s\n", (int)w, "case", "rate", (int)w, "anchor",
              "anchor rate", "ratio");
  for (size_t i = 0; i < cases().size(); i++) {
    if (!want[i]) continue;
    const Case &c = cases()[i];
    const Result &r = results()[c.name];
    if (r.error) {
      failed = true;
      std::printf("%-*s FAILED: %s\n", (int)w, c.name.c_str(), r.message.c_str());
      continue;
    }
    Row row{c.name, c.metric, c.anchor, rate_of(c, r), NAN, NAN, ""};
    const Case *a = c.anchor.empty() ? nullptr : find_case(c.anchor);
    if (a) {
      // The anchor's rate in the metric of this case.
      Case as = *a;
      as.metric = c.metric;
      row.anchor_rate = rate_of(as, results()[a->name]);
      row.refused = refusal(c, a);
      row.ratio = row.refused.empty() ? ratio_of(c, r, as, results()[a->name]) : NAN;
    }
    rows.push_back(row);
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.2f %s", row.rate, c.metric.c_str());
    if (c.anchor.empty()) {
      std::printf("%-*s %12s  %-*s\n", (int)w, c.name.c_str(), rate, (int)w, "(anchor)");
    } else if (!a) {
      std::printf("%-*s %12s  %-*s %12s\n", (int)w, c.name.c_str(), rate, (int)w, c.anchor.c_str(),
                  "(unknown)");
    } else {
      char arate[32];
      std::snprintf(arate, sizeof arate, "%.2f", row.anchor_rate);
      if (row.refused.empty())
        std::printf("%-*s %12s  %-*s %12s %8.3f\n", (int)w, c.name.c_str(), rate, (int)w,
                    c.anchor.c_str(), arate, row.ratio);
      else
        std::printf("%-*s %12s  %-*s %12s  refused\n", (int)w, c.name.c_str(), rate, (int)w,
                    c.anchor.c_str(), arate);
    }
  }
  bool any_refused = false;
  for (const Row &row : rows) any_refused = any_refused || !row.refused.empty();
  for (const auto &d : distrusted())
    if (any_refused)
      std::printf("ratios involving %s refused: %s\n", d.first.c_str(), d.second.c_str());
  std::fflush(stdout);
  if (json_path && *json_path) append_ratios(json_path, rows);
  return failed ? 1 : 0;
}

}  // extern "C"
