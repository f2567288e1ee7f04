#include "metrics/torch_names.h"

#include <cctype>
#include <string_view>

namespace tide::metrics::detail {

namespace {

// "SimpleElasticAgent._rendezvous" -> "simple_elastic_agent_rendezvous":
// a word starts at an upper-case letter after a lower-case one or a digit;
// runs of anything else become one '_', none at either end.
std::string snake(std::string_view s) {
  std::string out;
  auto is_lower_or_digit = [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c));
  };
  for (size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (!std::isalnum(c)) {
      if (!out.empty() && out.back() != '_') {
        out.push_back('_');
      }
      continue;
    }
    if (std::isupper(c) && i > 0 && is_lower_or_digit(s[i - 1]) &&
        !out.empty() && out.back() != '_') {
      out.push_back('_');
    }
    out.push_back(static_cast<char>(std::tolower(c)));
  }
  while (!out.empty() && out.back() == '_') {
    out.pop_back();
  }
  return out;
}

}  // namespace

PrometheusName prometheus_name(
    const std::string& group, const std::string& name) {
  PrometheusName out;
  out.labels["metric"] = name;
  std::string what = name;
  // "<kind>.<who>.<what>": the who becomes a label.
  for (auto [prefix, label] :
       {std::pair<std::string_view, const char*>{"workers.", "role"},
        {"health_check.", "check"}}) {
    auto last = name.rfind('.');
    if (name.starts_with(prefix) && last != std::string::npos &&
        last > prefix.size()) {
      out.labels[label] = name.substr(prefix.size(), last - prefix.size());
      what = std::string(prefix) + name.substr(last + 1);
      break;
    }
  }
  std::string g = snake(group);
  out.base = "tide_" + (g.empty() ? std::string() : g + "_") + snake(what);
  constexpr std::string_view kTotal = "_total";
  if (out.base.ends_with(kTotal)) {
    out.base.resize(out.base.size() - kTotal.size());
  }
  return out;
}

}  // namespace tide::metrics::detail
