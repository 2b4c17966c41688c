"""A small notebook assistant written with LangGraph: a model that calls tools in a loop, and a
SQLite checkpointer so a conversation survives a restart.

    python user_graph.py "Remember that the plumber comes on Tuesday."

needs OPENAI_API_KEY (and OPENAI_BASE_URL for another OpenAI-compatible endpoint).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

NOTEBOOK = Path("notebook.jsonl")
CONTACTS = Path("contacts")


@tool
def add_note(text: str) -> str:
    """Append a note to the notebook. Each call adds one more note."""
    with NOTEBOOK.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    with NOTEBOOK.open(encoding="utf-8") as notes:
        count = sum(1 for _ in notes)
    return f"saved as note {count}"


@tool
def save_contact(name: str, phone: str) -> str:
    """Save a contact's phone number, replacing any number saved for that name before."""
    CONTACTS.mkdir(exist_ok=True)
    key = "".join(ch if ch.isalnum() else "_" for ch in name)[:40] or "_"
    (CONTACTS / f"{key}.json").write_text(json.dumps({"name": name, "phone": phone}, ensure_ascii=False),
                                         encoding="utf-8")
    return f"{name}: {phone}"


tools = [add_note, save_contact]
llm = ChatOpenAI(model="gpt-4o-mini", temperature=0).bind_tools(tools)


def assistant(state: MessagesState) -> dict:
    return {"messages": [llm.invoke(state["messages"])]}


def build(checkpointer):
    builder = StateGraph(MessagesState)
    builder.add_node("assistant", assistant)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "assistant")
    builder.add_conditional_edges("assistant", tools_condition)
    builder.add_edge("tools", "assistant")
    return builder.compile(checkpointer=checkpointer)


if __name__ == "__main__":
    with SqliteSaver.from_conn_string("notebook.db") as saver:
        graph = build(saver)
        config = {"configurable": {"thread_id": "me"}}
        result = graph.invoke({"messages": [HumanMessage(" ".join(sys.argv[1:]) or "What is in my notebook?")]},
                              config)
        print(result["messages"][-1].content)
