"""The cache's ground rules: where things live, who may trust them, and how a finished thing is published."""
