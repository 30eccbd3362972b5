import pytest

from trtllm_entrypoint.errors import EntrypointError
from trtllm_entrypoint.repository import pbtxt

ENSEMBLE = """
# a comment
name: "ensemble"   # trailing comment
platform: "ensemble"
max_batch_size: 64
input [
  { name: "text_input"  data_type: TYPE_STRING dims: [ -1 ] },
  { name: "max_tokens", data_type: TYPE_INT32, dims: [ -1 ] }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "preprocessing"
      model_version: -1
      input_map { key: "QUERY" value: "text_input" }
      input_map { key: "REQUEST_OUTPUT_LEN" value: "max_tokens" }
      output_map { key: "INPUT_ID" value: "_INPUT_ID" }
    }
  ]
}
parameters: {
  key: "engine_dir"
  value: { string_value: "/a \\"quoted\\" #path" }
}
"""


def test_reads_names_steps_and_maps():
    config = pbtxt.parse(ENSEMBLE)
    assert (config["name"], config["platform"], config["max_batch_size"]) == ("ensemble", "ensemble", 64)
    assert pbtxt.names(config["input"]) == ["text_input", "max_tokens"]
    assert pbtxt.names(config["output"]) == ["text_output"]
    assert config["input"][0]["dims"] == [-1]
    [step] = config["ensemble_scheduling"]["step"]
    assert step["model_name"] == "preprocessing" and step["model_version"] == -1
    assert pbtxt.map_entries(step["input_map"]) == {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens"}
    assert pbtxt.map_entries(step["output_map"]) == {"INPUT_ID": "_INPUT_ID"}


def test_string_escapes_and_hash_inside_strings():
    parameters = pbtxt.map_entries(pbtxt.parse(ENSEMBLE)["parameters"])
    assert parameters == {"engine_dir": {"string_value": '/a "quoted" #path'}}


def test_repeated_fields_are_lists_even_when_written_once():
    config = pbtxt.parse('parameters { key: "a" value { string_value: "1" } }\ninstance_group [ { count: 2 } ]')
    assert isinstance(config["parameters"], list) and config["parameters"][0]["key"] == "a"
    assert config["instance_group"] == [{"count": 2}]


def test_scalars_numbers_identifiers_and_string_forms():
    config = pbtxt.parse('a: 1.5 b: -3 c: 0x10 d: true e: \'single\\tquote\' f: "x" "y" g: 1e3; h: "\\101"')
    assert config == {"a": 1.5, "b": -3, "c": 16, "d": "true", "e": "single\tquote", "f": "xy", "g": 1000.0, "h": "A"}


def test_angle_bracket_messages():
    assert pbtxt.parse("m < x: 1 >") == {"m": {"x": 1}}


@pytest.mark.parametrize(
    "text, where, what",
    [
        ('name: "open', "1:7", "unterminated string"),
        ("a {\n  b: 1\n", "3:1", "expected a field name or '}', found end of file"),
        ("a: [1 2]", "1:7", "expected ',' or ']'"),
        ("max_batch_size: ${triton_max_batch_size}", "1:17", "unexpected character '$'"),
        ("x 1", "1:3", "expected ':', '{' or '['"),
        ('a: "\\q"', "1:5", "unknown escape"),
    ],
)
def test_syntax_errors_name_line_and_column(text, where, what):
    with pytest.raises(EntrypointError) as info:
        pbtxt.parse(text, "cfg.pbtxt")
    assert info.value.message.startswith(f"cfg.pbtxt:{where}: ")
    assert what in info.value.message
