"""mini-swe-agent (2.x, unmodified, from PyPI) as a rollout scaffold behind the session gateway:
its litellm model talks to the gateway, its environment runs commands in our sandboxes."""
