"""What operators read (views) and do (actions)."""
