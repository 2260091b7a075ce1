"""Who may talk to which namespace, shared by both front ends (the AMQP endpoint and the HTTP side of the port).

- ``sas``: Shared Access Signature tokens, made and checked as Service Bus does.
- ``authority``: one namespace's rules turning tokens and PLAIN credentials into rights, and the right each
  operation needs.
- ``directory``: which namespace a connection (AMQP or HTTP) talks to, by its host name, and that namespace's
  authority.

Below ``endpoint/`` and ``http/``, above the namespace and ``model/``: neither front end imports the other.
"""
