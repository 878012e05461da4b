"""The shard_map boundary: `st.shard_map` (`shard_map`) and the specs derived from hints and
placed arguments (`specs`)."""
