"""`python -m spmdtyped port`: the libcst codemod (`codemod`), its source scan (`scan`) and the
traced observations it annotates from (`observe`)."""
