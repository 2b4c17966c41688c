"""A small notebook assistant written with the OpenAI Agents SDK: an agent with two function
tools, its conversation kept in a SQLite session so it survives a restart.

    python user_agent.py "Remember that the plumber comes on Tuesday."

needs OPENAI_API_KEY.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from agents import Agent, Runner, SQLiteSession, function_tool

NOTEBOOK = Path("notebook.jsonl")
CONTACTS = Path("contacts")


@function_tool
def add_note(text: str) -> str:
    """Append a note to the notebook. Each call adds one more note.

    Args:
        text: what to write down.
    """
    with NOTEBOOK.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    with NOTEBOOK.open(encoding="utf-8") as notes:
        count = sum(1 for _ in notes)
    return f"saved as note {count}"


@function_tool
def save_contact(name: str, phone: str) -> str:
    """Save a contact's phone number, replacing any number saved for that name before.

    Args:
        name: the contact's name.
        phone: their phone number.
    """
    CONTACTS.mkdir(exist_ok=True)
    key = "".join(ch if ch.isalnum() else "_" for ch in name)[:40] or "_"
    (CONTACTS / f"{key}.json").write_text(json.dumps({"name": name, "phone": phone}, ensure_ascii=False),
                                         encoding="utf-8")
    return f"{name}: {phone}"


agent = Agent(
    name="Notebook",
    instructions="You keep the user's notebook and contacts. Use the tools to save what they ask you to.",
    model="gpt-4.1-mini",
    tools=[add_note, save_contact],
)


if __name__ == "__main__":
    session = SQLiteSession("me", "notebook.db")
    result = Runner.run_sync(agent, " ".join(sys.argv[1:]) or "What is in my notebook?", session=session)
    print(result.final_output)
