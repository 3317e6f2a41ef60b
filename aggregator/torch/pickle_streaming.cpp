// The reader's streaming half: the trace lists of a torch snapshot recognised as the pickle builds
// them, and their entries handed to a TraceSink as soon as each is complete (see Builder in
// pickle_builder.hpp for the shape it relies on and how it backs out).
#include <algorithm>

#include "torch/pickle_builder.hpp"

namespace memsnap::pickle {

using namespace opcodes;

// An EMPTY_LIST just pushed: is it the traces list, or a trace list inside it?
void Builder::recognise_list() {
  const Node& list = m_stack.back();
  const std::size_t below = m_stack.size() - 1;  // values under the new list
  if (!m_root || below == 0 || m_stack[0] != m_root) return;
  if (!m_traces) {
    // The value of "device_traces" in the root dict: [root, MARK?, k, v, ..., "device_traces", list].
    const std::size_t base = m_marks.empty() ? 1 : m_marks.back();
    if (base != 1 || m_marks.size() > 1 || (below - base) % 2 != 1) return;
    const Value& key = *m_stack[below - 1];
    if (key.m_kind != Kind::string || key.m_text != "device_traces") return;
    m_traces = list;
    return;
  }
  // A trace: pushed right above the traces list (APPEND), or above a MARK right above it (APPENDS).
  std::size_t device;
  if (m_stack[below - 1] == m_traces && (m_marks.empty() || m_marks.back() < below)) {
    device = m_traces->m_items.size();
  } else if (!m_marks.empty() && m_marks.back() >= 1 && m_marks.back() <= below &&
             m_stack[m_marks.back() - 1] == m_traces) {
    device = m_traces->m_items.size() + (below - m_marks.back());
  } else {
    return;
  }
  list->m_streamed = true;
  m_lists.push_back(StreamedList{list.get(), device, 0});
}

// The values m_stack[base, end) appended to a streamed trace list: checked as if stored, then
// given to the sink.
void Builder::stream_entries(Value& list, std::size_t base) {
  if (!began()) {
    list_append(list, base);
    return;
  }
  StreamedList& s = streamed_list(list);
  for (std::size_t i = base; i < m_stack.size(); ++i) {
    if (!m_stack[i]) continue;  // went to the sink early
    adopt(list, m_stack[i]);
    m_sink->entry(s.device, s.count++, m_stack[i]);
  }
  m_early_end = 0;
}

// Asks the sink to begin, once; false when streaming is off.
bool Builder::began() {
  if (!m_began && m_streaming) {
    m_began = m_sink->begin(segments_so_far());
    if (!m_began) stop_streaming();
  }
  return m_began;
}

Builder::StreamedList& Builder::streamed_list(const Value& list) {
  for (auto& l : m_lists)
    if (l.list == &list) return l;
  fail("internal: a streamed list that is not known");
}

// Early streaming: an entry is complete once the next one starts above the same MARK (torch's
// entries are dicts, so at EMPTY_DICT). Handed to the sink then, it need not wait for the
// APPENDS of its batch of 1000, so one entry at a time is in memory. Its stack slot is left empty
// (a placeholder that APPENDS skips). Only an entry nothing else refers to (not shared), after
// which every earlier one went too, so the order stays.
void Builder::stream_early() {
  const std::size_t base = m_marks.back();
  if (base == 0 || m_stack.size() <= base || !m_stack[base - 1]) return;
  Value& list = *m_stack[base - 1];
  if (!list.m_streamed || list.m_nested) return;
  const std::size_t last = m_stack.size() - 1;
  if (last != base && m_stack[last - 1]) return;
  const Node& item = m_stack[last];
  if (!item || item->m_shared || item->m_depth + 1 > m_opt.max_depth) return;  // APPENDS reports depth
  if (!began()) return;
  StreamedList& s = streamed_list(list);
  adopt(list, item);
  m_sink->entry(s.device, s.count++, item);
  m_stack[last].reset();
  m_early_base = base;
  m_early_end = last + 1;
}

// The root's "segments" value so far: set in the dict, or waiting above its MARK. nullptr when
// there is none yet, or when it could still be changed (it is shared and not yet nested).
ValuePtr Builder::segments_so_far() {
  ValuePtr found;
  for (const auto& [k, v] : m_root->m_dict)
    if (k->m_kind == Kind::string && k->m_text == "segments") found = v;
  const std::size_t base = m_marks.empty() || m_marks.front() != 1 ? m_stack.size() : 1;
  for (std::size_t i = base; i + 1 < m_stack.size() && m_stack[i + 1] != m_traces; i += 2) {
    const Value& k = *m_stack[i];
    if (k.m_kind == Kind::string && k.m_text == "segments") found = m_stack[i + 1];
  }
  if (found && found->m_shared && !found->m_nested) found = nullptr;
  m_segments = found;
  return found;
}

void Builder::stop_streaming() {
  if (m_began) throw ReadAgainWhole{};
  m_streaming = false;
  for (auto& l : m_lists) l.list->m_streamed = false;
  m_lists.clear();
  m_root.reset();
  m_traces.reset();
}

// At STOP: the tree holds every streamed list where the sink was told it is, and every list in
// the traces is one of them; root["segments"] is what begin saw.
void Builder::check_streamed() const {
  bool ok = m_stack.back() == m_root && m_root->find_ptr("device_traces") == m_traces &&
            m_root->find_ptr("segments") == m_segments;
  const auto& traces = m_traces->m_items;
  for (std::size_t d = 0; ok && d < traces.size(); ++d)
    if (traces[d]->m_kind == Kind::list) {
      const Value* t = traces[d].get();
      ok = t->m_streamed && std::any_of(m_lists.begin(), m_lists.end(), [&](const StreamedList& l) {
             return l.list == t && l.device == d;
           });
    }
  for (const auto& l : m_lists)
    if (ok && l.count > 0) ok = l.device < traces.size() && traces[l.device].get() == l.list;
  if (!ok) throw ReadAgainWhole{};
}

}  // namespace memsnap::pickle
