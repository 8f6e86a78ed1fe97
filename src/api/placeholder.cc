namespace nibble {}
