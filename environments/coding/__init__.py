"""Coding-v0: Python tasks (HumanEval style, assert lists, stdin/stdout) checked in the sandbox."""

from environments.coding.checker import CheckReport, CodeChecker, TestOutcome, grading_path
from environments.coding.env import CodingEnv, coding_rubric
from environments.coding.extract import extract_code
from environments.coding.loaders import load_bundled, load_humaneval, load_jsonl, load_mbpp, load_tasks
from environments.coding.split import TestSplit, split_tests

__all__ = [
    "CheckReport",
    "CodeChecker",
    "CodingEnv",
    "TestOutcome",
    "TestSplit",
    "coding_rubric",
    "extract_code",
    "grading_path",
    "load_bundled",
    "load_humaneval",
    "load_jsonl",
    "load_mbpp",
    "load_tasks",
    "split_tests",
]
