#include "call_without_frame_pointer.hpp"

#if defined(__x86_64__)
// push rbp keeps the stack 16-byte aligned at the call; the CFI says where the caller's rbp is.
asm(R"(
  .text
  .globl memsnap_test_call_without_frame_pointer
  .type memsnap_test_call_without_frame_pointer, @function
memsnap_test_call_without_frame_pointer:
  .cfi_startproc
  push %rbp
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %rbp, 0
  mov $1, %ebp
  mov %rdi, %rax
  mov %rsi, %rdi
  call *%rax
  pop %rbp
  .cfi_adjust_cfa_offset -8
  .cfi_restore %rbp
  ret
  .cfi_endproc
  .size memsnap_test_call_without_frame_pointer, .-memsnap_test_call_without_frame_pointer
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif
