// A call through a frame whose frame pointer no walk accepts, for the tests and benches of the
// native-stack fallback: stacks::capture's frame-pointer walk gives up at that frame (as it does
// in a library built without frame pointers that uses rbp for something else), and libunwind's
// DWARF unwinder, led by the frame's call frame information, takes the stack past it.
#pragma once

#if defined(__x86_64__)
#define MEMSNAP_TEST_HAVE_CALL_WITHOUT_FRAME_POINTER 1
// fn(arg), called with rbp = 1 (defined in call_without_frame_pointer.cpp).
extern "C" void memsnap_test_call_without_frame_pointer(void (*fn)(void*), void* arg);
#endif
