"""The dispatcher: preprocess -> cached layout inference -> execute/wrap."""
