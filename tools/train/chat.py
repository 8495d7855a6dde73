"""The chat format of the embedded default model (fixed; the C++ side implements exactly this)."""
import json
import re

SYSTEM_ON = "detailed thinking on"
SYSTEM_OFF = "detailed thinking off"
EOS = "<|role_end|>"

JINJA_TEMPLATE = (
    "<role>SYSTEM</role>{{ 'detailed thinking off' if thinking is defined and not thinking else 'detailed thinking on' }}"
    "<|role_end|>{% for m in messages %}{% if m['role'] == 'user' %}<role>HUMAN</role>{{ m['content'] }}<|role_end|>"
    "{% elif m['role'] == 'assistant' %}<role>ASSISTANT</role>{{ m['content'] }}<|role_end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}")


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def split_answer(answer):
    """GSM8K answer -> (worked solution without <<...>> annotations and without '#### N', N)."""
    body, _, final = answer.rpartition("####")
    body = re.sub(r"<<[^>]*>>", "", body).strip()
    return body, final.strip()


def prompt(question, thinking):
    return ("<role>SYSTEM</role>" + (SYSTEM_ON if thinking else SYSTEM_OFF) + "<|role_end|><role>HUMAN</role>"
            + question + "<|role_end|><role>ASSISTANT</role>")


def target(solution, n, thinking):
    if thinking:
        return "\n<think>\n" + solution + "\n</think>\n\n" + "The answer is " + n + "." + EOS
    return solution + "\nThe answer is " + n + "." + EOS
