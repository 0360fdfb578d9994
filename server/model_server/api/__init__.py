"""HTTP routes: health, the simple JSON API and the Open Inference Protocol (v2)."""
