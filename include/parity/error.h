// Errors thrown by library code. Library code never prints or exits: it throws
// one of these with a message that says what went wrong, where (file, line,
// field) and what was expected. Only tools/ catches, prints and exits.
#pragma once

#include <stdexcept>
#include <string>

namespace parity {

// Base of every error parity throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: a config, a data file, a plan, a checkpoint or a flag.
// what() is complete and ready to show ("FILE:LINE: field 'x.y': expected ..., got ...").
class InputError : public Error {
 public:
  using Error::Error;
};

// Training stopped because its numbers stopped being numbers: a NaN or an infinity in the loss,
// the dense parameters, the weights or the predictions (a learning rate too high for the model and
// batch, or bad values in the data). what() names the step and what was found.
class NumericalError : public Error {
 public:
  using Error::Error;
};

// Throws InputError formatted as "<where>: <message>" when cond is false.
void require(bool cond, const std::string& where, const std::string& message);

}  // namespace parity
