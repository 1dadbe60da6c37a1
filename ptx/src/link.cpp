// PTX modules linked at the text level (orion/ptx/link.h).
#include "orion/ptx/link.h"

#include <algorithm>
#include <map>
#include <set>

namespace orion::ptx {
namespace {

bool IdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
}

// One top-level statement of a module: a directive line, a declaration ending in ';', or a
// function with its body.
struct Item {
  std::string text;
  enum Kind { kHeader, kDebug, kFunc, kEntry, kVar, kOther } kind = kOther;
  std::string name;
  bool is_extern = false, is_visible = false, is_weak = false, has_body = false;
  bool shared = false;  // a .shared variable (`.extern .shared` is dynamic shared memory, not a reference)
};

// Splits `t` into top-level items; false on unbalanced braces or an unterminated comment.
bool Split(std::string_view t, std::vector<Item>* out) {
  size_t i = 0;
  while (i < t.size()) {
    // Skip whitespace and comments between items.
    while (i < t.size()) {
      if (t[i] == ' ' || t[i] == '\t' || t[i] == '\r' || t[i] == '\n') {
        ++i;
      } else if (t.compare(i, 2, "//") == 0) {
        while (i < t.size() && t[i] != '\n') ++i;
      } else if (t.compare(i, 2, "/*") == 0) {
        const size_t e = t.find("*/", i + 2);
        if (e == std::string_view::npos) return false;
        i = e + 2;
      } else {
        break;
      }
    }
    if (i >= t.size() || t[i] == '\0') break;
    const size_t start = i;
    // Directives that end at the end of their line.
    const bool line_directive = t.compare(i, 8, ".version") == 0 || t.compare(i, 7, ".target") == 0 ||
                                t.compare(i, 13, ".address_size") == 0 || t.compare(i, 5, ".file") == 0;
    int depth = 0;
    bool done = false;
    bool initializer = false;  // `= {...}` of a variable: its item ends at the ';' after the braces
    while (i < t.size() && !done) {
      const char c = t[i];
      if (c == '\0') break;
      if (line_directive && c == '\n') break;
      if (t.compare(i, 2, "//") == 0) {
        while (i < t.size() && t[i] != '\n') ++i;
        continue;
      }
      if (t.compare(i, 2, "/*") == 0) {
        const size_t e = t.find("*/", i + 2);
        if (e == std::string_view::npos) return false;
        i = e + 2;
        continue;
      }
      if (c == '"') {
        ++i;
        while (i < t.size() && t[i] != '"' && t[i] != '\n') i += t[i] == '\\' ? 2 : 1;
        ++i;
        continue;
      }
      if (c == '=' && depth == 0) initializer = true;
      if (c == '{') ++depth;
      if (c == '}') {
        if (--depth < 0) return false;
        if (depth == 0 && !initializer) done = true;  // a function body
      }
      if (c == ';' && depth == 0) done = true;
      ++i;
    }
    if (depth != 0) return false;
    Item it;
    it.text = std::string(t.substr(start, i - start));
    out->push_back(std::move(it));
  }
  return true;
}

// The words of an item's head (before its first '(', '{', '[', '=' or ';').
std::vector<std::string> HeadWords(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  for (char c : s) {
    if (c == '(' || c == '{' || c == '[' || c == '=' || c == ';') break;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (!cur.empty()) w.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) w.push_back(std::move(cur));
  return w;
}

// The identifier that starts at or after `i` (skipping blanks); "" if none.
std::string IdentAt(const std::string& s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  size_t e = i;
  while (e < s.size() && IdChar(s[e])) ++e;
  return s.substr(i, e - i);
}

void Classify(Item* it) {
  const std::vector<std::string> w = HeadWords(it->text);
  if (w.empty()) return;
  if (w[0] == ".version" || w[0] == ".target" || w[0] == ".address_size") {
    it->kind = Item::kHeader;
    return;
  }
  if (w[0] == ".file" || w[0] == ".section") {
    it->kind = Item::kDebug;
    return;
  }
  for (const auto& x : w) {
    it->is_extern |= x == ".extern";
    it->is_visible |= x == ".visible";
    it->is_weak |= x == ".weak" || x == ".common";
    it->shared |= x == ".shared";
  }
  const bool func = std::find(w.begin(), w.end(), ".func") != w.end();
  const bool entry = std::find(w.begin(), w.end(), ".entry") != w.end();
  it->has_body = it->text.find('{') != std::string::npos && (func || entry);
  if (func || entry) {
    it->kind = func ? Item::kFunc : Item::kEntry;
    size_t k = it->text.find(func ? ".func" : ".entry") + (func ? 5 : 6);
    while (k < it->text.size() && (it->text[k] == ' ' || it->text[k] == '\t' || it->text[k] == '\n')) ++k;
    if (func && k < it->text.size() && it->text[k] == '(') {  // the return parameter list
      int d = 0;
      for (; k < it->text.size(); ++k) {
        if (it->text[k] == '(') ++d;
        if (it->text[k] == ')' && --d == 0) {
          ++k;
          break;
        }
      }
    }
    it->name = IdentAt(it->text, k);
    return;
  }
  const bool var = std::any_of(w.begin(), w.end(), [](const std::string& x) {
    return x == ".global" || x == ".const" || x == ".shared" || x == ".local";
  });
  if (var) {
    it->kind = Item::kVar;
    std::string last = w.back();
    while (!last.empty() && !IdChar(last.back())) last.pop_back();
    it->name = last;
  }
}

// `text` with every whole-word occurrence of `from` replaced by `to`.
std::string Rename(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  size_t i = 0;
  while (true) {
    const size_t p = text.find(from, i);
    if (p == std::string::npos) break;
    const bool left = p == 0 || !IdChar(text[p - 1]);
    const bool right = p + from.size() >= text.size() || !IdChar(text[p + from.size()]);
    out.append(text, i, p - i);
    out += left && right ? to : from;
    i = p + from.size();
  }
  out.append(text, i, std::string::npos);
  return out;
}

// The body without `.loc` lines (debug line information).
std::string DropLoc(const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    size_t e = text.find('\n', i);
    if (e == std::string::npos) e = text.size();
    const std::string_view line(text.data() + i, e - i);
    const size_t f = line.find_first_not_of(" \t");
    if (f == std::string_view::npos || line.compare(f, 4, ".loc") != 0 ||
        (f + 4 < line.size() && IdChar(line[f + 4]))) {
      out.append(line);
      if (e < text.size()) out += '\n';
    }
    i = e + 1;
  }
  return out;
}

// The leading decimal digits of `s` as a number, at most 4 of them (PTX versions and sm_ numbers
// are small; a module's text is hostile input, and atoi overflows): "12abc" -> 12, "x" -> 0.
int LeadingNumber(std::string_view s) {
  int v = 0;
  for (size_t i = 0; i < s.size() && i < 4 && s[i] >= '0' && s[i] <= '9'; ++i) v = v * 10 + (s[i] - '0');
  return v;
}

int VersionTimes10(const std::string& header) {
  const std::vector<std::string> w = HeadWords(header);
  if (w.size() < 2) return 0;
  const size_t dot = w[1].find('.');
  const int major = LeadingNumber(w[1]) * 10;
  if (dot == std::string::npos) return major;
  return major + LeadingNumber(std::string_view(w[1]).substr(dot + 1, 1));
}

int SmOf(const std::string& header) {
  const size_t p = header.find("sm_");
  return p == std::string::npos ? 0 : LeadingNumber(std::string_view(header).substr(p + 3));
}

const std::set<std::string>& DriverProvided() {
  static const std::set<std::string> s = {"vprintf", "malloc", "free", "__assertfail"};
  return s;
}

}  // namespace

Result<std::string> LinkText(const std::vector<std::string_view>& modules) {
  if (modules.empty()) return InvalidArgument("nothing to link");
  if (modules.size() >= kMaxLinkModules) return InvalidArgument("64 or more PTX modules to link");
  std::vector<std::vector<Item>> items(modules.size());
  for (size_t m = 0; m < modules.size(); ++m) {
    if (!Split(modules[m], &items[m])) {
      return InvalidArgument("PTX input " + std::to_string(m + 1) +
                             " has unbalanced braces or an unterminated comment");
    }
    bool has_version = false;
    for (Item& it : items[m]) {
      Classify(&it);
      has_version |= it.kind == Item::kHeader && it.text.rfind(".version", 0) == 0;
    }
    if (!has_version) return InvalidArgument("PTX input " + std::to_string(m + 1) + " is not PTX text (no .version)");
  }
  // Module-local names that an earlier module already uses: renamed in their own module.
  std::set<std::string> seen;
  for (size_t m = 0; m < modules.size(); ++m) {
    std::set<std::string> local, mine;
    for (const Item& it : items[m]) {
      if (it.name.empty()) continue;
      mine.insert(it.name);
      if (!it.is_extern && !it.is_visible && !it.is_weak && (it.kind != Item::kEntry)) local.insert(it.name);
    }
    for (const std::string& n : local) {
      if (seen.count(n) == 0) continue;
      const std::string to = n + "$orion" + std::to_string(m);
      for (Item& it : items[m]) {
        it.text = Rename(it.text, n, to);
        if (it.name == n) it.name = to;
      }
      mine.erase(n);
      mine.insert(to);
    }
    seen.insert(mine.begin(), mine.end());
  }
  // Definitions with linkage: the one kept per name.
  struct Def {
    size_t m, i;
    bool weak;
  };
  std::map<std::string, Def> defs;
  for (size_t m = 0; m < items.size(); ++m) {
    for (size_t i = 0; i < items[m].size(); ++i) {
      const Item& it = items[m][i];
      const bool definition = (it.kind == Item::kFunc && it.has_body) || it.kind == Item::kEntry ||
                              (it.kind == Item::kVar && !it.is_extern);
      if (!definition || it.name.empty()) continue;
      auto [pos, fresh] = defs.try_emplace(it.name, Def{m, i, it.is_weak});
      if (fresh) continue;
      if (pos->second.weak && !it.is_weak) {
        pos->second = Def{m, i, false};  // a strong definition beats a weak one
      } else if (!pos->second.weak && !it.is_weak) {
        return InvalidArgument("multiple definition of '" + it.name + "' (PTX inputs " +
                               std::to_string(pos->second.m + 1) + " and " + std::to_string(m + 1) + ")");
      }
    }
  }
  // Unresolved references.
  std::set<std::string> unresolved_funcs;
  for (const auto& mod : items) {
    for (const Item& it : mod) {
      if (!it.is_extern || it.shared || it.name.empty() || defs.count(it.name) != 0) continue;
      if (it.kind == Item::kFunc && DriverProvided().count(it.name) != 0) {
        unresolved_funcs.insert(it.name);
        continue;
      }
      return NotFound(
          "undefined reference to '" + it.name + "'" +
          (it.name.rfind("cuda", 0) == 0 ? " (the CUDA device runtime, libcudadevrt, is not linked by Orion)" : ""));
    }
  }
  // The header.
  std::string version, target;
  int best_version = -1, best_sm = -1;
  for (const auto& mod : items) {
    for (const Item& it : mod) {
      if (it.kind != Item::kHeader) continue;
      if (it.text.rfind(".version", 0) == 0 && VersionTimes10(it.text) > best_version) {
        best_version = VersionTimes10(it.text);
        version = it.text;
      }
      if (it.text.rfind(".target", 0) == 0 && SmOf(it.text) > best_sm) {
        best_sm = SmOf(it.text);
        target = it.text;
      }
    }
  }
  std::string out =
      "// Linked by Orion (guest cuLinkComplete) from " + std::to_string(modules.size()) + " PTX modules\n";
  out += version + "\n" + target + "\n.address_size 64\n\n";
  // Variables: kept definitions, module-local ones, dynamic shared memory declarations (once).
  std::set<std::string> emitted_shared;
  for (size_t m = 0; m < items.size(); ++m) {
    for (size_t i = 0; i < items[m].size(); ++i) {
      const Item& it = items[m][i];
      if (it.kind != Item::kVar) continue;
      if (it.is_extern && it.shared) {
        if (emitted_shared.insert(it.name).second) out += it.text + "\n";
        continue;
      }
      if (it.is_extern) continue;  // resolved: its definition is emitted
      auto d = defs.find(it.name);
      if (d != defs.end() && (d->second.m != m || d->second.i != i)) continue;  // a losing weak copy
      out += it.text + "\n";
    }
  }
  out += "\n";
  // Functions the driver provides, declared once.
  std::set<std::string> declared;
  for (const auto& mod : items) {
    for (const Item& it : mod) {
      if (it.kind == Item::kFunc && it.is_extern && unresolved_funcs.count(it.name) != 0 &&
          declared.insert(it.name).second) {
        out += it.text + "\n";
      }
    }
  }
  // A prototype of every function kept, so any module may call any other's.
  for (const auto& [name, d] : defs) {
    const Item& it = items[d.m][d.i];
    if (it.kind != Item::kFunc) continue;
    std::string head = it.text.substr(0, it.text.find('{'));
    while (!head.empty() && (head.back() == ' ' || head.back() == '\n' || head.back() == '\t' || head.back() == '\r'))
      head.pop_back();
    out += head + ";\n";
  }
  out += "\n";
  for (size_t m = 0; m < items.size(); ++m) {
    for (size_t i = 0; i < items[m].size(); ++i) {
      const Item& it = items[m][i];
      if ((it.kind != Item::kFunc && it.kind != Item::kEntry) || !it.has_body) continue;
      auto d = defs.find(it.name);
      if (d != defs.end() && (d->second.m != m || d->second.i != i)) continue;
      out += DropLoc(it.text) + "\n\n";
    }
  }
  return out;
}

}  // namespace orion::ptx
