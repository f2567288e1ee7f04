#include "timeline/font.h"

#include <algorithm>
#include <iterator>

#include "timeline/dejavu_sans_widths.h"

namespace tide::timeline {
namespace {

constexpr std::string_view kEllipsis = "\u2026";

// The code point that starts at s[i], and where the next one starts. Bytes
// that are not valid UTF-8 count as one code point each.
char32_t decode(const std::string& s, size_t& i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char lead = byte(i);
  size_t len = (lead >> 5) == 0x6    ? 2
               : (lead >> 4) == 0xE  ? 3
               : (lead >> 3) == 0x1E ? 4
                                     : 1;
  if (len == 1 || i + len > s.size()) {
    ++i;
    return lead;
  }
  char32_t cp = lead & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) {
      ++i;
      return lead;
    }
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  i += len;
  return cp;
}

double advance_em(char32_t cp, Weight weight) {
  const auto& table = detail::kDejaVuSansAdvances;
  auto it = std::lower_bound(
      std::begin(table), std::end(table), cp, [](const auto& g, char32_t c) {
        return g.code_point < c;
      });
  if (it == std::end(table) || it->code_point != cp) {
    return 1.0;
  }
  return static_cast<double>(weight == Weight::kBold ? it->bold : it->book) /
         detail::kDejaVuUnitsPerEm;
}

}  // namespace

double text_width(const std::string& s, double font_size, Weight weight) {
  double em = 0;
  for (size_t i = 0; i < s.size();) {
    em += advance_em(decode(s, i), weight);
  }
  return em * font_size;
}

std::string fit(
    const std::string& s, double width, double font_size, Weight weight) {
  if (text_width(s, font_size, weight) <= width) {
    return s;
  }
  double budget = width / font_size - advance_em(U'\u2026', weight);
  double em = 0;
  size_t kept = 0;
  for (size_t i = 0; i < s.size();) {
    em += advance_em(decode(s, i), weight);
    if (em > budget) {
      break;
    }
    kept = i;
  }
  if (kept == 0) {
    return "";
  }
  // No blank right before the ellipsis: "worker …" reads as a cut word.
  std::string out = s.substr(0, kept);
  while (!out.empty() && out.back() == ' ') {
    out.pop_back();
  }
  return out + std::string(kEllipsis);
}

}  // namespace tide::timeline
