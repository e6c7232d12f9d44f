"""A synthetic world's own shoppers as a simulator, and how a simulator's decisions align with theirs.

For lakes generated from a world (``world.json`` beside the tables): the ceiling of the evaluation
(the world playing its own shoppers, and the A/B arms played under its ranking policies). It imports
``synthetic`` and ``evaluation``; neither imports it: the flows hand its simulator to the evaluation.
"""
