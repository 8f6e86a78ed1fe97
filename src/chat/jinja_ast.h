// The parsed form of a chat template: expression and statement nodes, each with the position
// it came from (for errors). One generic node per family keeps the tree small: `kind` says
// which fields are used.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace nibble::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // items (a tuple is a list too)
    kDict,      // items: key, value, key, value, ...
    kAttr,      // items[0].name
    kIndex,     // items[0][items[1]]
    kSlice,     // items[0][items[1]:items[2]:items[3]] (null items are absent bounds)
    kCall,      // items[0](items[1..]); names[i] is the keyword of items[i] or ""
    kFilter,    // items[0] | name(items[1..], keywords as kCall)
    kTest,      // items[0] is [not] name(items[1..]); negate
    kUnary,     // op items[0]: "-", "+", "not"
    kBinary,    // items[0] op items[1]: arithmetic, comparison, "in", "not in", "and", "or", "~"
    kTernary,   // items[1] if items[0] else items[2] (items[2] may be null: undefined)
  };
  Kind kind = Kind::kLiteral;
  SourcePos pos;
  std::string name;  // name / attribute / filter / test / operator
  Value value;       // literal
  std::vector<ExprPtr> items;
  std::vector<std::string> names;  // keyword names of call / filter / test arguments
  bool negate = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ exprs[0] }}
    kIf,        // exprs[i] → bodies[i]; bodies[exprs.size()] is the else branch when present
    kFor,       // for targets in exprs[0] [if exprs[1]]: bodies[0], else bodies[1]
    kSet,       // set targets[0] (or targets as a tuple; attr: targets[0].attr) = exprs[0]
    kSetBlock,  // set targets[0] %}bodies[0]{% endset
    kMacro,     // macro name(targets with defaults exprs: null for none): bodies[0]
    kBreak,
    kContinue,
    kBlock,     // bodies[0] rendered as it is ({% generation %})
  };
  Kind kind = Kind::kText;
  SourcePos pos;
  std::string text;  // text / macro name
  std::string attr;  // set ns.attr
  std::vector<std::string> targets;
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
  bool has_filter = false;  // for ... if
};

}  // namespace nibble::chat
