// The shape notes of import: a dict's keys that export would not write back as they were.
#include "torch/snapshot_shape.hpp"

#include <algorithm>

namespace memsnap::torch::detail {

ShapeNotes note_shape(const Value& dict, std::span<const KeySpec> written) {
  ShapeNotes n;
  for (const auto& spec : written) {
    const Value* v = dict.find(spec.key);
    if (!v || !fits(*v, spec.shape)) n.absent.push_back(spec.key);
  }
  for (const auto& item : dict.dict_items()) {
    // Named copies: clang 14 cannot capture structured bindings in a lambda.
    const auto& k = item.first;
    const auto& v = item.second;
    const bool known = k->is_string() && std::any_of(written.begin(), written.end(), [&](const KeySpec& spec) {
                         return spec.key == k->as_string() && fits(*v, spec.shape);
                       });
    if (!known) n.other.emplace_back(k, v);
  }
  return n;
}

void put_notes(const ShapeNotes& n, nlohmann::json& x, JsonBudget& budget, std::span<const std::string_view> skip) {
  auto absent = nlohmann::json::array();
  for (auto key : n.absent)
    if (std::find(skip.begin(), skip.end(), key) == skip.end()) absent.push_back(std::string(key));
  if (!absent.empty()) x["absent"] = std::move(absent);
  if (!n.other.empty()) x["other"] = to_json_at(budget.keep(Value::dict(n.other)), 0, budget);
}

bool internable_frames(const ValuePtr& frames) {
  return frames && frames->is_list() &&
         std::all_of(frames->items().begin(), frames->items().end(), [](const ValuePtr& f) { return f->is_dict(); });
}

}  // namespace memsnap::torch::detail
