// Batch boundaries for a window whose source marked none (a torch snapshot without step
// annotations, a CUPTI trace without NVTX ranges): found from the trace's own structure.
//
// In this order of trust, the first that fits wins:
//   step_annotation       an annotation that names a step or batch ("ProfilerStep#5", "batch 3")
//   recurring_annotation  an annotation that recurs once per batch (Optimizer.step, zero_grad)
//   recurring_frame       a frame whose allocations come in one burst per batch (the training
//                         loop's backward() line, an optimizer's step, a collective)
//   periodicity           the allocation sequence repeats itself (the same stacks, or sizes when
//                         there are no stacks, in the same order every batch)
// An anchor recurs at some fixed point of each batch; the boundary is then placed where the
// allocated bytes are lowest at one offset from every anchor (a batch ends when its
// activations and gradients are gone), refined to each batch's own low point nearby.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memsnap/record.hpp"

namespace memsnap {

/// An external annotation of the trace (torch's record_function ranges).
struct Annotation {
  std::string name;
  bool start = true;  // START (true) or END (false)
  std::int64_t time_ns = 0;
};

struct BatchInferenceOptions {
  /// Batches the window is known to span (the config's interval, the distance between a
  /// rank's consecutive windows); 0 when unknown.
  int expected_batches = 0;
};

struct InferredBatches {
  std::string method = "none";       // see above; "none" when nothing fitted
  double confidence = 0;             // 0..1
  std::string detail;                // "Optimizer.step#AdamW.step END, 4 times", ...
  std::vector<std::int64_t> starts;  // start time of each batch found in the window, ascending
  bool numbered = false;             // step_annotation: `numbers` hold the batch numbers
  std::vector<std::int64_t> numbers;
};

/// Finds the batch starts of `window` (its events and live_at_start; `rank` for the stacks).
InferredBatches infer_batches(const RankRecord& rank, const WindowRecord& window,
                              const std::vector<Annotation>& annotations,
                              const BatchInferenceOptions& options = {});

/// Numbers the batches found and writes them to the window: batches, batch_start,
/// batch_method, batch_confidence, batch_detail. The last batch found is `batch_end` (the
/// window closes at the end of the batch it is named after) unless the method numbered them.
void apply_inferred_batches(const InferredBatches& found, WindowRecord& window);

}  // namespace memsnap
