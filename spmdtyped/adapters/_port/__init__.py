"""`python -m spmdtyped port`: the libcst codemod (`codemod`), its source scan (`scan`) and the
traced observations it annotates from (`observe`); `port --enable-vma`'s migration of
`check_vma=False` code (`vma`) and what it changes in the numbers (`vma_numbers`)."""
