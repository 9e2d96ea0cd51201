// The subcommands of ./gpt2, one file each; main.c only dispatches.
#pragma once

int cmd_generate(int argc, char **argv);    // generate.c: ./gpt2 [-p PROMPT] ... (the default)
int cmd_validate(int argc, char **argv);    // validate.c: ./gpt2 validate -m MODEL DUMP
int cmd_tokenize(int argc, char **argv);    // tokenize_cmd.c: ./gpt2 tokenize [-f FILE | TEXT]
int cmd_detokenize(int argc, char **argv);  // tokenize_cmd.c: ./gpt2 detokenize ID...
int cmd_bench(int argc, char **argv);       // bench.c: ./gpt2 bench [-m MODEL] [--size S] [--json FILE] [--quick]
int cmd_compare(int argc, char **argv);     // compare.c: ./gpt2 compare: fused vs reference, block by block
