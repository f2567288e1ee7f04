#pragma once

#include <string>

// The font the picture is drawn in, and how wide text is in it. Text is
// measured with DejaVu Sans's own advance widths (dejavu_sans_widths.h), so
// that a label cut to fit its space is cut where a browser drawing DejaVu
// Sans would need it cut; the SVG names that font first.
namespace tide::timeline {

// The font-family the picture asks for: the measured font first, then ones of
// about its widths.
inline constexpr const char* kFontFamily = "DejaVu Sans, Verdana, sans-serif";

enum class Weight { kBook, kBold };

// The advance width in pixels of s (UTF-8) at font_size. Code points the
// table lacks count one em, wider than any it holds, so that text in another
// script errs on the side of being cut. Kerning, which only narrows DejaVu
// Sans's pairs, is left out for the same reason.
double text_width(
    const std::string& s, double font_size, Weight weight = Weight::kBook);

// s when it fits in width pixels, else its longest prefix that fits with an
// ellipsis after it (never splitting a UTF-8 sequence), or "" when not even
// one character and the ellipsis fit.
std::string fit(
    const std::string& s,
    double width,
    double font_size,
    Weight weight = Weight::kBook);

}  // namespace tide::timeline
