// tide._elastic: the C++ pieces under tide.elastic (torch.distributed.
// elastic's Python API) and tide.ft: the agent, rendezvous handlers,
// stores, metrics, events, timers and the quorum client, one file each
// (src/pyelastic/). Python configures them and receives their results and
// callbacks (python/tide/elastic/, python/tide/ft.py). The GIL
// is released around everything that may block, and taken only around calls
// into Python; an exception a Python metric or event handler raises is
// logged and the caller goes on.
#include "pyelastic/py_common.h"

PYBIND11_MODULE(_elastic, m) {
  namespace pe = tide::pyelastic;
  m.doc() =
      "tide's agent, rendezvous, stores, metrics, events and timers "
      "under tide.elastic";
  pybind11::register_exception_translator(pe::translate_errors);
  pe::bind_stores(m);
  pe::bind_rendezvous(m);
  pe::bind_agent(m);
  pe::bind_metrics_and_events(m);
  pe::bind_timers(m);
  pe::bind_ft(m);
}
