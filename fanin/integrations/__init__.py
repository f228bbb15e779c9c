"""Receipts straight from agent frameworks: LangGraph and Google ADK.

Each integration lives in its own module and imports its framework only there, so ``import
fanin.integrations`` needs neither; install them with ``pip install 'fanin[langgraph]'`` or
``pip install 'fanin[adk]'``:

- ``fanin.integrations.langgraph.attach(graph, emitter)``: a LangChain callback handler on a
  compiled LangGraph graph.
- ``fanin.integrations.adk.attach(app_or_runner, emitter)``: an ADK plugin for workflows.

Both report the same way (``fanin.integrations.fanout``): a node with two or more possible
successors opens a join whose required branches are all of them, the successors a conditional
route did not choose are skipped, and every successor run is a receipt. The mapping from each
framework's concepts, and where Fanin's close differs from the framework's own join, is in
``docs/integrations.md``.
"""
