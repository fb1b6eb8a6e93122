#include "cai/core/toml_text.h"

#include <fmt/format.h>

#include <string>

namespace cai {

std::string_view strip_utf8_bom(std::string_view text) {
  return text.substr(0, 3) == "\xEF\xBB\xBF" ? text.substr(3) : text;
}

std::string toml_text_problem(std::string_view t) {
  enum class In { Code, Comment, Basic, Literal, MultiBasic, MultiLiteral } in = In::Code;
  int line = 1;
  size_t line_start = 0;
  bool trimming = false;  // after a line-ending backslash in a multi-line basic string
  // Outside strings and comments, toml++ reads a bare token (a key, a number, a date, a word)
  // up to a terminator (whitespace, ',', ']', '}', '#'; a key also at '=' and '.') and asks
  // about every character of it, quotes and brackets included: `7777$'p...` or `1"cc...` is one
  // token, and a quote protects what follows only where a string may start, after structure.
  // Inside an array (even one spanning lines) '.' belongs to the token: `[2, 1."\xC7\xAA"]` is the
  // bare token `1."...` to toml++, so the quote starts no string. `nest` holds the open '[' / '{'.
  bool key = true;  // before the '=' of a line (or after '{' / ',' of an inline table)
  std::string nest;
  auto key_here = [&] { return nest.empty() || nest.back() == '{'; };
  bool in_token = false;  // inside a bare token
  char prev = '\n';       // the last structural character outside strings and comments
  auto where = [&](size_t i) {
    return fmt::format("line {}, column {}", line, i - line_start + 1);
  };
  auto non_ascii = [&](size_t i, const char* what) {
    return fmt::format(
        "{}: the byte 0x{:02X} starts a non-ASCII character {} (TOML allows them "
        "only inside strings and comments)",
        where(i), static_cast<unsigned char>(t[i]), what);
  };
  auto starts = [&](size_t i, std::string_view s) { return t.substr(i, s.size()) == s; };
  const std::string_view basic3 = "\"\"\"", literal3 = "'''";
  for (size_t i = 0; i < t.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    if (c == '\n') {
      ++line;
      line_start = i + 1;
    }
    switch (in) {
      case In::Code:
        if (c >= 0x80) return non_ascii(i, "outside a string or comment");
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
          in_token = false;
          if (c == '\n') prev = '\n', key = key_here();
        } else if (c == '#') {
          in = In::Comment, in_token = false;
        } else if (c == ',' || c == ']' || c == '}' || ((c == '=' || c == '.') && key) ||
                   (!in_token && (c == '[' || c == '{'))) {
          in_token = false, prev = static_cast<char>(c);
          if (c == '=') key = false;
          if (c == '[' || c == '{') nest.push_back(static_cast<char>(c));
          if ((c == ']' || c == '}') && !nest.empty()) nest.pop_back(), key = false;
          if (c == '{') key = true;
          if (c == ',') key = key_here();
        } else if ((c == '"' || c == '\'') && !in_token &&
                   (prev == '\n' || prev == '=' || prev == '[' || prev == ',' || prev == '{' ||
                    prev == '.')) {
          if (starts(i, basic3)) {
            in = In::MultiBasic, i += 2;
          } else if (starts(i, literal3)) {
            in = In::MultiLiteral, i += 2;
          } else {
            in = c == '"' ? In::Basic : In::Literal;
          }
          prev = '"';  // a string is a token: what follows it directly is no string start
        } else {
          in_token = true;
        }
        break;
      case In::Comment:
        if (c == '\n') in = In::Code, prev = '\n', key = key_here();
        break;
      case In::Basic:
        if (c == '\\' && i + 1 < t.size()) {
          if (static_cast<unsigned char>(t[i + 1]) >= 0x80)
            return non_ascii(i + 1, "right after a backslash");
          ++i;  // the escaped character (a quote does not end the string)
        } else if (c == '"' || c == '\n') {
          in = In::Code;
        }
        break;
      case In::Literal:
        if (c == '\'' || c == '\n') in = In::Code;
        break;
      case In::MultiBasic:
        if (trimming) {
          if (c == ' ' || c == '\t' || c == '\r' || c == '\n') break;
          if (c >= 0x80) return non_ascii(i, "after a line-ending backslash");
          trimming = false;
        }
        if (c == '\\' && i + 1 < t.size()) {
          const unsigned char d = static_cast<unsigned char>(t[i + 1]);
          if (d >= 0x80) return non_ascii(i + 1, "right after a backslash");
          if (d == ' ' || d == '\t' || d == '\r' || d == '\n') trimming = true;
          if (d == '\n') {
            ++line;
            line_start = i + 2;
          }
          ++i;
        } else if (starts(i, "\"\"\"")) {
          i += 2;
          while (i + 1 < t.size() && t[i + 1] == '"') ++i;  // up to two quotes end the content
          in = In::Code;
        }
        break;
      case In::MultiLiteral:
        if (starts(i, "'''")) {
          i += 2;
          while (i + 1 < t.size() && t[i + 1] == '\'') ++i;
          in = In::Code;
        }
        break;
    }
  }
  return {};
}

}  // namespace cai
