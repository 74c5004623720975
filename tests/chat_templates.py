"""Chat templates written for the tests, one per model family, each reproducing the behaviour of that family's
published template that matters to incremental rendering (read for reference, not copied):

- QWEN3: earlier reasoning is dropped once a new user message arrives; within a tool loop it is kept; the last
  assistant turn gets an (empty) ``<think>`` block, earlier ones do not.
- DEEPSEEK_R1: ``<think>`` is stripped from every assistant turn; the generation prompt opens ``<think>\\n``.
- MISTRAL_NEMO: the system prompt and the tool list are rendered in the LAST user message only.
- HERMES3: a tool response is rendered differently once it is no longer the last message.
- GPT_OSS: harmony; an earlier final answer ends ``<|end|>`` where the last one ends ``<|return|>``, earlier
  final answers lose their analysis, calls end ``<|call|>``, and a tool message without a preceding call is
  refused.
- LLAMA31, DEEPSEEK_V31, KIMI_K2: prefix-preserving; their own tool-call formats.

All literal text sits in string expressions, so HF's trim_blocks/lstrip_blocks cannot change it.
"""

QWEN3 = (
    "{%- if tools or messages[0].role == 'system' -%}{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- if tools -%}{{- '\\n# Tools\\n<tools>' -}}{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>' -}}{%- endif -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' and loop.first -%}"
    "{%- elif m.role == 'user' or m.role == 'system' -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- set content = m.content -%}{%- set reasoning = '' -%}"
    "{%- if m.reasoning_content is defined and m.reasoning_content is not none -%}{%- set reasoning = m.reasoning_content -%}"
    "{%- elif '</think>' in content -%}{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}"
    "{%- else -%}{{- '<|im_start|>assistant\\n' + content -}}{%- endif -%}"
    "{%- for c in (m.tool_calls or []) -%}{%- set f = c.function -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + (f.arguments | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

DEEPSEEK_R1 = (
    "{{- '<｜begin▁of▁sentence｜>' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{{- '<｜User｜>' + m.content -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- set content = m.content -%}{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}{%- endif -%}"
    "{{- '<｜Assistant｜>' + content -}}"
    "{%- if m.tool_calls -%}{{- '<｜tool▁calls▁begin｜>' -}}{%- for c in m.tool_calls -%}"
    "{{- '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + c.function.name + '\\n```json\\n' + (c.function.arguments | tojson) + '\\n```<｜tool▁call▁end｜>' -}}"
    "{%- endfor -%}{{- '<｜tool▁calls▁end｜>' -}}{%- endif -%}"
    "{{- '<｜end▁of▁sentence｜>' -}}"
    "{%- elif m.role == 'tool' -%}{{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜><｜tool▁outputs▁end｜>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<｜Assistant｜><think>\\n' -}}{%- endif -%}"
)

MISTRAL_NEMO = (
    "{%- if messages[0].role == 'system' -%}{%- set system = messages[0].content -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set system = none -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in loop_messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{{- '<s>' -}}"
    "{%- for m in loop_messages -%}"
    "{%- if m.role == 'user' -%}"
    "{%- if tools and loop.index0 == ns.last_user -%}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}{%- endif -%}"
    "{%- if system and loop.index0 == ns.last_user -%}{{- '[INST]' + system + '\\n\\n' + m.content + '[/INST]' -}}"
    "{%- else -%}{{- '[INST]' + m.content + '[/INST]' -}}{%- endif -%}"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}{{- '[TOOL_CALLS][' -}}"
    "{%- for c in m.tool_calls -%}{{- '{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson) + ', \"id\": \"' + c.id + '\"}' -}}"
    "{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}{%- endfor -%}{{- ']</s>' -}}"
    "{%- elif m.role == 'assistant' -%}{{- m.content + '</s>' -}}"
    "{%- elif m.role == 'tool' -%}{{- '[TOOL_RESULTS]{\"content\": ' + (m.content | tojson) + ', \"call_id\": \"' + m.tool_call_id + '\"}[/TOOL_RESULTS]' -}}"
    "{%- endif -%}{%- endfor -%}"
)

HERMES3 = (
    "{%- if tools -%}{{- '<|im_start|>system\\nYou may call functions. <tools>' + (tools | tojson) + '</tools><|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' or m.role == 'system' -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' -%}{{- '<|im_start|>assistant\\n' + m.content -}}"
    "{%- for c in (m.tool_calls or []) -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>tool\\n' -}}{%- endif -%}"
    "{{- '<tool_response>\\n' + m.content -}}"
    "{%- if loop.last -%}{{- '\\n</tool_response>' -}}{%- else -%}{{- '\\n</tool_response>\\n' -}}{%- endif -%}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

GPT_OSS = (
    "{{- '<|start|>system<|message|>You are a test model.\\nReasoning: medium<|end|>' -}}"
    "{%- if tools -%}{{- '<|start|>developer<|message|># Tools\\nnamespace functions {' -}}"
    "{%- for t in tools -%}{{- '\\ntype ' + t.function.name + ' = (_: any) => any;' -}}{%- endfor -%}{{- '\\n}<|end|>' -}}{%- endif -%}"
    "{%- set ns = namespace(called=false) -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{- '<|start|>developer<|message|>' + m.content + '<|end|>' -}}"
    "{%- elif m.role == 'user' -%}{{- '<|start|>user<|message|>' + m.content + '<|end|>' -}}"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}{%- set ns.called = true -%}"
    "{%- if m.thinking -%}{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' -}}{%- endif -%}"
    "{%- set c = m.tool_calls[0].function -%}"
    "{{- '<|start|>assistant<|channel|>commentary to=functions.' + c.name + ' <|constrain|>json<|message|>' + (c.arguments | tojson) + '<|call|>' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- if loop.last and not add_generation_prompt -%}"
    "{%- if m.thinking -%}{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' -}}{%- endif -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|return|>' -}}"
    "{%- else -%}{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' -}}{%- endif -%}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if not ns.called -%}{{- raise_exception('Message has tool role, but there was no previous assistant message with a tool call!') -}}{%- endif -%}"
    "{{- '<|start|>functions.' + m.name + ' to=assistant<|channel|>commentary<|message|>' + (m.content | tojson) + '<|end|>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)

LLAMA31 = (
    "{{- '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n' -}}"
    "{%- if tools -%}{{- 'Environment: ipython\\n' -}}{%- endif -%}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}{{- '<|eot_id|>' -}}"
    "{%- for m in loop_messages -%}"
    "{%- if m.role == 'user' and loop.first and tools -%}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\nGiven the following functions, respond with a JSON function call.\\n\\n' -}}"
    "{%- for t in tools -%}{{- (t | tojson) + '\\n\\n' -}}{%- endfor -%}{{- m.content + '<|eot_id|>' -}}"
    "{%- elif m.role == 'user' -%}{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' -}}"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}{%- set c = m.tool_calls[0].function -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n{\"name\": \"' + c.name + '\", \"parameters\": ' + (c.arguments | tojson) + '}<|eot_id|>' -}}"
    "{%- elif m.role == 'assistant' -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' -}}"
    "{%- elif m.role == 'tool' -%}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

DEEPSEEK_V31 = (
    "{{- '<｜begin▁of▁sentence｜>' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- if tools -%}{{- '\\n\\n## Tools\\n' -}}{%- for t in tools -%}{{- (t | tojson) + '\\n' -}}{%- endfor -%}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{{- '<｜User｜>' + m.content -}}"
    "{%- elif m.role == 'assistant' -%}{{- '<｜Assistant｜></think>' + m.content -}}"
    "{%- if m.tool_calls -%}{{- '<｜tool▁calls▁begin｜>' -}}{%- for c in m.tool_calls -%}"
    "{{- '<｜tool▁call▁begin｜>' + c.function.name + '<｜tool▁sep｜>' + (c.function.arguments | tojson) + '<｜tool▁call▁end｜>' -}}"
    "{%- endfor -%}{{- '<｜tool▁calls▁end｜>' -}}{%- endif -%}{{- '<｜end▁of▁sentence｜>' -}}"
    "{%- elif m.role == 'tool' -%}{{- '<｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<｜Assistant｜></think>' -}}{%- endif -%}"
)

KIMI_K2 = (
    "{%- if tools -%}{{- '<|im_system|>tool_declare<|im_middle|>' + (tools | tojson) + '<|im_end|>' -}}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{- '<|im_system|>system<|im_middle|>' + m.content + '<|im_end|>' -}}"
    "{%- elif m.role == 'user' -%}{{- '<|im_user|>user<|im_middle|>' + m.content + '<|im_end|>' -}}"
    "{%- elif m.role == 'assistant' -%}{{- '<|im_assistant|>assistant<|im_middle|>' + m.content -}}"
    "{%- if m.tool_calls -%}{{- '<|tool_calls_section_begin|>' -}}{%- for c in m.tool_calls -%}"
    "{{- '<|tool_call_begin|>' + c.id + '<|tool_call_argument_begin|>' + (c.function.arguments | tojson) + '<|tool_call_end|>' -}}"
    "{%- endfor -%}{{- '<|tool_calls_section_end|>' -}}{%- endif -%}{{- '<|im_end|>' -}}"
    "{%- elif m.role == 'tool' -%}{{- '<|im_system|>tool<|im_middle|>## Return of ' + m.tool_call_id + '\\n' + m.content + '<|im_end|>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}{%- endif -%}"
)
